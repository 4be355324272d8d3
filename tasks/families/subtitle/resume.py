"""A subtitle job's checkpoints (issue #19): what ``engines.transcribe`` keeps after a recognition
window, and how the next attempt takes it back.

Kept after a window (at most every ``FARM_CHECKPOINT_INTERVAL``, and with batched recognition
only after a whole batch, so that a resumed attempt batches the windows as a run never stopped):

* the VAD pass's result (spans, duration), so that a resumed attempt skips it;
* how many windows are done, and how far on the media clock they reach (the checkpoint's position);
* the words not yet in a final cue, and the chunked WebVTT writer's cues waiting for a window;
* the language heard so far (the first window's holds for the rest) and the recogniser's name;
* as files: the WebVTT segments and the playlist written so far, and a journal of the segments
  and cues made since the previous checkpoint (``resume/part-NNNNN.jsonl``, one file per
  checkpoint, so that no file grows and is rewritten: a checkpoint's cost does not grow with the
  job). The journal is read back into ``subtitles.json`` and removed when the job ends.

The next attempt recognises from the window after the last one done. On the same recogniser (the
same engine and parameters) it carries on with the kept words, so its words and cues equal a run
never stopped. On another one (a lower rung) the kept words first become cues of their own, then
the new recogniser goes on: no cue mixes words of two recognisers, and each cue says which rung
made it (``Cue.rung``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mediafarm.tasks.families.subtitle.records import Cue, RejectedSpan, Segment, Word
from mediafarm.tasks.families.vad.spec import VadResult
from mediafarm.tasks.kit import Checkpoint, EngineContext, Made, Span, made_until

# The state's own format ("subtitle" key): an attempt that finds another starts over.
STATE_VERSION = 1
JOURNAL = "resume"

log = logging.getLogger(__name__)


@dataclass
class Resumed:
    """A subtitle checkpoint, checked, as the next attempt uses it."""

    checkpoint: Checkpoint
    exact: bool  # the same recogniser goes on: the kept words join its own, as in a run never stopped

    @property
    def state(self) -> Mapping[str, Any]:
        return self.checkpoint.state

    @classmethod
    def of(cls, checkpoint: Checkpoint | None, identity: Mapping[str, Any]) -> Resumed | None:
        if checkpoint is None:
            return None
        state = checkpoint.state
        if state.get("subtitle") != STATE_VERSION:
            log.warning("subtitle checkpoint state of another format (%r); starting over", state.get("subtitle"))
            return None
        return cls(checkpoint, exact=state.get("identity") == dict(identity))

    @property
    def windows(self) -> int:
        return int(self.state["windows"])

    @property
    def window_seconds(self) -> float:
        """The longest window the checkpoint's attempt planned: the next one plans the same (a
        checkpoint from before windows had several lengths planned them of 28 s)."""
        return float(self.state.get("window_seconds", 28.0))

    def vad(self) -> VadResult:
        kept = self.state["vad"]
        return VadResult(spans=[Span(start, end) for start, end in kept["spans"]], duration=kept["duration"],
                         model=kept["model"])  # fmt: skip

    def rejected(self) -> list[RejectedSpan]:
        """The spans the first attempt set aside (a checkpoint from before they were kept: none)."""
        return [RejectedSpan.model_validate(r) for r in self.state.get("rejected", [])]

    def pending_words(self) -> list[Word]:
        return [Word.model_validate(w) for w in self.state["pending"]]

    def chunk_state(self) -> Mapping[str, Any]:
        return self.state["chunks"]

    def journal(self, ctx: EngineContext) -> Iterator[tuple[str, dict[str, Any]]]:
        """The kept journal's entries in order: ("segment" | "cue", the record's JSON)."""
        for name in sorted(n for n in self.checkpoint.files if n.startswith(f"{JOURNAL}/")):
            with ctx.artifacts.path(name).open(encoding="utf-8") as fh:
                for line in fh:
                    entry = json.loads(line)
                    yield entry["kind"], entry["value"]

    def parts(self, rung: str, end: float) -> tuple[Made, ...]:
        """Which rung recognised which stretch: the checkpoint's, then this attempt's to ``end``."""
        return made_until(self.checkpoint, rung, end)


@dataclass
class Journal:
    """The segments and cues made since the last checkpoint, written as one journal file at the
    next; and the names of the files each checkpoint keeps."""

    ctx: EngineContext
    parts: list[str] = field(default_factory=list)
    _entries: list[str] = field(default_factory=list)

    def segment(self, segment: Segment) -> None:
        self._entries.append(json.dumps({"kind": "segment", "value": json.loads(segment.model_dump_json())}))

    def cues(self, cues: Sequence[Cue]) -> None:
        self._entries += [json.dumps({"kind": "cue", "value": c.model_dump(mode="json")}) for c in cues]

    def flush(self) -> None:
        if not self._entries:
            return
        name = f"{JOURNAL}/part-{len(self.parts):05d}.jsonl"
        self.ctx.artifacts.write_text(name, "\n".join(self._entries) + "\n")
        self.parts.append(name)
        self._entries = []

    def remove(self) -> None:
        """The job is done: the journal is in subtitles.json, and is no artifact of the job."""
        for name in self.parts:
            self.ctx.artifacts.path(name).unlink(missing_ok=True)
        folder = self.ctx.artifacts.folder / JOURNAL
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def vad_state(vad: VadResult) -> dict[str, Any]:
    """The VAD pass's result as the checkpoint keeps it: unrounded (the result's JSON rounds to
    milliseconds, and the windows are planned on the exact times)."""
    return {"spans": [[s.start, s.end] for s in vad.spans], "duration": vad.duration, "model": vad.model}


def tag_cues(cues: Sequence[Cue], parts: Sequence[Made]) -> list[Cue]:
    """Each cue with the rung that made it: the rung of the part its start is in."""
    tagged = []
    for cue in cues:
        rung = next((p.rung for p in reversed(parts) if cue.start >= p.start), parts[0].rung)
        tagged.append(cue.model_copy(update={"rung": rung}))
    return tagged
