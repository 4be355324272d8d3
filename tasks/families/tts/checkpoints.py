"""A TTS attempt's checkpoints: kept after finished chunks, and the track rebuilt from them on resume.

The rule is in ``tts.resume``. What a checkpoint holds: the finished chunk files (by name: they are
hard-linked, not copied) and a state of a few numbers per sentence: the next chunk, the samples
and last sentence the joiner had reached, and every sentence's span so far. Its position is the
characters of the chunks spoken (those the progress counts).

Resuming is exact because nothing of a chunk depends on another: every engine call speaks one
chunk's pieces on its own (Piper and espeak-ng deterministically, ChatTTS with a seed per call),
and the joiner's state at a chunk's end is those two numbers. The output file is one growing
encoder stream, which no checkpoint can keep while it grows; the resumed attempt opens a new one
and feeds it the kept chunks, one at a time (memory stays flat), as 16-bit PCM. The unkilled run
feeds its encoder the same PCM (``audio.pcm16``), so both files are encoded from the same samples.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import soundfile as sf

from mediafarm.tasks.families.tts.audio import Joiner
from mediafarm.tasks.families.tts.resume import SHORT_TEXT_CHARS, STATE_VERSION
from mediafarm.tasks.families.tts.text import Plan
from mediafarm.tasks.kit import EngineContext

log = logging.getLogger(__name__)
CHUNKS = "chunks"


def chunk_name(index: int) -> str:
    return f"{CHUNKS}/chunk_{index:05d}.wav"


@dataclass
class ChunkCheckpoints:
    """One attempt's checkpoints of a spoken text.

    Attributes:
        ctx: The attempt's context (``ctx.resume``, ``ctx.checkpoint``).
        plan: The text's chunks.
        voice: The voice's label: a checkpoint of another voice is not gone on from.
        rate: The voice's sample rate.
        max_chars: The rung's chunk size: another one cuts the text into other chunks.
        text_chars: The request's text length: a short one never checkpoints.
    """

    ctx: EngineContext
    plan: Plan
    voice: str
    rate: int
    max_chars: int
    text_chars: int

    @property
    def keeps(self) -> bool:
        return self.text_chars > SHORT_TEXT_CHARS

    def start(self, joiner: Joiner, spans: dict[int, list[int]]) -> int:
        """The chunk to speak first: 0, or the one after the checkpoint's, with ``joiner`` and
        ``spans`` set where the checkpoint left them. A checkpoint that does not fit this attempt
        (another voice or chunking on the same rung, files that do not add up) is logged and
        not gone on from."""
        checkpoint = self.ctx.resume
        if checkpoint is None:
            return 0
        try:
            state = self._fitting(checkpoint.state, checkpoint.position, checkpoint.files)
        except (ValueError, RuntimeError) as exc:  # RuntimeError: soundfile cannot read a kept chunk
            log.warning("job %s: its checkpoint does not fit this attempt, speaking from the start: %s",
                        self.ctx.job_id, exc)  # fmt: skip
            # Its chunks are not this attempt's: none of them may stay among its artifacts.
            for name in checkpoint.files:
                self.ctx.artifacts.path(name).unlink(missing_ok=True)
            return 0
        joiner.resume(state["samples"], state["last_sentence"])
        spans.update({i: list(span) for i, span in enumerate(state["spans"])})
        return int(state["next"])

    def _fitting(self, state: Any, position: float, files: tuple[str, ...]) -> dict[str, Any]:
        wanted = {"version": STATE_VERSION, "voice": self.voice, "rate": self.rate, "max_chars": self.max_chars,
                  "chunks": len(self.plan.chunks)}  # fmt: skip
        for key, value in wanted.items():
            if state.get(key) != value:
                raise ValueError(f"its {key} is {state.get(key)!r}, this attempt's {value!r}")
        following = state.get("next")
        if not isinstance(following, int) or not 0 < following < len(self.plan.chunks):
            raise ValueError(f"its next chunk {following!r} is not inside the text's {len(self.plan.chunks)}")
        if position != sum(c.chars for c in self.plan.chunks[:following]):
            raise ValueError(f"its position {position} is not the end of chunk {following - 1}")
        names = [chunk_name(i) for i in range(following)]
        if list(files) != names:
            raise ValueError(f"it keeps {len(files)} files, not chunks 0-{following - 1}")
        frames = sum(sf.info(str(self.ctx.artifacts.path(name))).frames for name in names)
        if frames != state.get("samples"):
            raise ValueError(f"its chunks hold {frames} samples, its state says {state.get('samples')!r}")
        sentences = self.plan.chunks[following - 1].pieces[-1].sentence + 1
        if len(state.get("spans", ())) != sentences:
            raise ValueError(f"it has {len(state.get('spans', ()))} sentence spans, not {sentences}")
        return dict(state)

    def replay(self, until: int) -> Iterator[tuple[int, int, np.ndarray]]:
        """The kept chunks before ``until``, in order: (index, first sample, its 16-bit PCM), one
        in memory at a time."""
        first = 0
        for index in range(until):
            pcm, _ = sf.read(str(self.ctx.artifacts.path(chunk_name(index))), dtype="int16")
            yield index, first, pcm.reshape(-1)
            first += pcm.size

    def after(self, index: int, joiner: Joiner, spans: dict[int, list[int]]) -> None:
        """Chunk ``index`` is written: keep a checkpoint if one is due (and the text is long)."""
        following = index + 1
        if not self.keeps or following >= len(self.plan.chunks) or not self.ctx.checkpoint_due():
            return
        state = {
            "version": STATE_VERSION, "voice": self.voice, "rate": self.rate, "max_chars": self.max_chars,
            "chunks": len(self.plan.chunks), "next": following, "samples": joiner.samples,
            "last_sentence": joiner.last_sentence, "spans": [spans[i] for i in range(len(spans))],
        }  # fmt: skip
        position = sum(c.chars for c in self.plan.chunks[:following])
        self.ctx.checkpoint(position, state, files=[chunk_name(i) for i in range(following)])
