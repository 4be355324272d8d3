"""Cues as words arrive, final once nothing later can change them, and the canonical JSON as it grows.

Shared by the file subtitle job (``engines``) and the live one (``subtitle_live.job_state``): both
make their whole files and their chunked segments of the same cues.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import IO, Any

from mediafarm.tasks.families.subtitle.cues import build_cues, final_cues
from mediafarm.tasks.families.subtitle.records import Cue, Segment, Word
from mediafarm.tasks.families.subtitle.spec import SubtitleRequest


class CueStream:
    """Cues made as words arrive. A cue is final once a long enough pause closes the stretch of
    speech it belongs to (``cues.final_cues``): later words cannot change it. The whole file and
    the chunked segments are both made of these same cues.

    Speech with no such pause for FORCE_AFTER_SECONDS is cut anyway, before its last cue, so a
    player following a long monologue is never that far behind; the cues around that cut may
    differ slightly from cueing the whole monologue at once.
    """

    FORCE_AFTER_SECONDS = 60.0

    def __init__(self, request: SubtitleRequest, rung: str | None = None) -> None:
        self.rules = request.rules
        self.rung = rung  # tagged on each cue made here (a live job's attempts may run on several rungs)
        self.all: list[Cue] = []
        self._pending: list[Word] = []
        self._fresh: list[Cue] = []

    def add(self, words: Sequence[Word]) -> None:
        self._pending.extend(words)
        settled, count = final_cues(self._pending, self.rules)
        if not settled and self._pending and self._pending[-1].end - self._pending[0].start > self.FORCE_AFTER_SECONDS:
            cues = build_cues(self._pending, self.rules)
            # Words are counted back from the cue text: only safe when no word holds a space.
            if sum(len(c.text.split()) for c in cues) == len(self._pending):
                settled, count = cues[:-1], sum(len(c.text.split()) for c in cues[:-1])
        settled = self._tagged(settled)
        self.all.extend(settled)
        self._fresh.extend(settled)
        self._pending = self._pending[count:]

    def _tagged(self, cues: Sequence[Cue]) -> list[Cue]:
        if self.rung is None:
            return list(cues)
        return [c.model_copy(update={"rung": self.rung}) for c in cues]

    @property
    def pending(self) -> list[Word]:
        """Words heard that no final cue holds yet (a later word may still change their cue)."""
        return list(self._pending)

    def restore(self, pending: Sequence[Word]) -> None:
        """Take up the pending words a checkpoint kept (a resumed job goes on from them)."""
        self._pending = list(pending)

    def final_until(self, heard_until: float) -> float:
        """Time up to which no new cue can appear."""
        return self._pending[0].start if self._pending else heard_until

    def take_final(self) -> list[Cue]:
        fresh, self._fresh = self._fresh, []
        return fresh

    def take_rest(self) -> list[Cue]:
        rest = self._tagged(build_cues(self._pending, self.rules)) if self._pending else []
        self._pending = []
        self.all.extend(rest)
        return self.take_final() + rest


class JsonSegments:
    """subtitles.json written as segments arrive: ``{"segments": [...], <the rest>}``."""

    def __init__(self, fh: IO[str]) -> None:
        self.fh, self.count = fh, 0
        fh.write('{"segments": [')

    def write(self, segment: Segment) -> None:
        self.fh.write(("," if self.count else "") + "\n" + segment.model_dump_json())
        self.count += 1

    def close(self, **rest: Any) -> None:
        self.fh.write("\n]")
        for key, value in rest.items():
            self.fh.write(f",\n{json.dumps(key)}: {json.dumps(value)}")
        self.fh.write("}\n")
