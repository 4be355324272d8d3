"""The live job's HLS output: its segment files and the EVENT playlist, with its gaps marked."""

from __future__ import annotations

from collections.abc import Sequence

from mediafarm.tasks.families.subtitle.writers import segment_name
from mediafarm.tasks.families.subtitle_live.spec import Gap

CHUNKS = "chunks"
PLAYLIST = f"{CHUNKS}/playlist.m3u8"


def files(segments: int) -> list[str]:
    """The artifact names of the first ``segments`` segments, then the playlist's."""
    return [f"{CHUNKS}/{segment_name(k)}" for k in range(segments)] + [PLAYLIST]


def mark_gaps(playlist: str, gaps: Sequence[Gap], chunk_seconds: float) -> str:
    """``playlist`` (the writers' EVENT playlist) with ``#EXT-X-GAP`` before each segment wholly
    inside one of ``gaps`` (HLS: the segment is there, but its time holds no output: a player must
    not read it as silence); the playlist's version raised to 8, the tag's."""
    if not gaps:
        return playlist
    out: list[str] = []
    for line in playlist.split("\n"):
        if line.startswith("segment_") and line.endswith(".vtt"):
            k = int(line[len("segment_") : -len(".vtt")])
            if any(g.start <= k * chunk_seconds and (k + 1) * chunk_seconds <= g.end for g in gaps):
                out.insert(len(out) - 1, "#EXT-X-GAP")  # before its #EXTINF line
        out.append(line)
    return "\n".join("#EXT-X-VERSION:8" if line.startswith("#EXT-X-VERSION") else line for line in out)
