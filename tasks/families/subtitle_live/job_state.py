"""One live attempt's state: built fresh, or from the checkpoint the attempt resumes from.

What a checkpoint keeps (:meth:`LiveJob.state`) is all a later attempt needs to go on without
writing a published segment again, differently: the clock's origin and offset, the cues, the speech
spans, the gaps, the counts, and how many segments are written.
"""

from __future__ import annotations

import time
from typing import Any

from mediafarm.tasks.families.subtitle.cue_stream import CueStream
from mediafarm.tasks.families.subtitle.records import Cue
from mediafarm.tasks.families.subtitle.writers import ChunkedWebVTT
from mediafarm.tasks.families.subtitle_live import playlist as hls
from mediafarm.tasks.families.subtitle_live.clock import StreamClock
from mediafarm.tasks.families.subtitle_live.spec import Gap, LiveSubtitleRequest
from mediafarm.tasks.kit import EngineContext, Span
from mediafarm.tasks.kit.media import SAMPLE_RATE

STATE_VERSION = 1


def cue_key(cue: Cue) -> tuple[float, float, str]:
    """A cue's identity in the latency count: each is measured once, when first published."""
    return (cue.start, cue.end, cue.text)


class LiveJob:
    """One attempt's state, built fresh or from the checkpoint the attempt resumes from."""

    def __init__(self, ctx: EngineContext, request: LiveSubtitleRequest) -> None:
        self.ctx, self.request = ctx, request
        self.clock = StreamClock(SAMPLE_RATE)
        self.cues = CueStream(request, rung=ctx.rung)  # type: ignore[arg-type]  # it reads .rules only
        self.chunks = ChunkedWebVTT(window_seconds=request.chunk_seconds)
        self.speech: list[Span] = []
        self.gaps: list[Gap] = []
        self.latencies: list[float] = []
        self.words = 0
        self.silent_words = 0
        self.language: str | None = request.language
        self.model = ""
        self.started_at = time.time()  # this attempt's start
        self.ran_before = 0.0  # seconds the earlier attempts ran, up to the checkpoint this one resumes from
        self.attempts = 1
        self.resumed_at: float | None = None  # cue time the previous attempt's output reached
        self.final_until = 0.0
        self.published: set[tuple[float, float, str]] = set()
        self.backlog: list[tuple[int, int]] = []  # spans closed, not yet recognised (samples)
        self._pending_words = 0  # words the checkpoint counted that no final cue holds
        resume = ctx.resume
        if resume is not None and resume.state.get("version") == STATE_VERSION:
            self._restore(resume.state)

    def _restore(self, state: dict[str, Any]) -> None:
        self.clock.restore(state["clock"])
        self.cues.all = [Cue.model_validate(c) for c in state["cues"]]
        self.speech = [Span(a, b) for a, b in state["speech"]]
        self.gaps = [Gap.model_validate(g) for g in state["gaps"]]
        self.latencies = list(state["latencies"])
        self.words, self.silent_words = state["words"], state["silent_words"]
        self._pending_words = state.get("pending_words", 0)
        self.language = self.language or state.get("language")
        self.model = state.get("model", "")
        self.ran_before = float(state.get("ran", 0.0))
        self.attempts = state["attempts"] + 1
        self.final_until = self.resumed_at = state["final_until"]
        # The segments already written are back in the folder: move the writer past them (what it
        # returns for them is discarded), then hand it the final cues no segment holds yet.
        written = state["segments"]
        self.chunks.add([], final_until=written * self.request.chunk_seconds)
        self.chunks.add([c for c in self.cues.all if c.start >= written * self.request.chunk_seconds],
                        final_until=written * self.request.chunk_seconds)  # fmt: skip
        self.published = {cue_key(c) for c in self.cues.all}

    def state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION, "clock": self.clock.state(), "cues": [c.model_dump(mode="json") for c in self.cues.all],
            "speech": [[s.start, s.end] for s in self.speech], "gaps": [g.model_dump() for g in self.gaps],
            "latencies": self.latencies, "words": self.words, "pending_words": len(self.cues.pending),
            "silent_words": self.silent_words,
            "language": self.language, "model": self.model, "ran": self.ran,
            "attempts": self.attempts, "final_until": self.final_until, "segments": self.chunks.segment_count,
        }  # fmt: skip

    @property
    def ran(self) -> float:
        """Seconds the job's attempts have run, this one until now (the time between a lost
        attempt's checkpoint and the next attempt's start is not counted: no attempt ran)."""
        return self.ran_before + (time.time() - self.started_at)

    def replay(self) -> None:
        """The attempt reads the stream again from the checkpoint (a pushed stream keeps its
        audio): what was heard after the checkpoint is heard again, so it is not kept twice (a span
        the checkpoint cuts through, in a long monologue, ends there: the replay finds the rest)."""
        at = self.resumed_at
        assert at is not None
        self.speech = [Span(s.start, min(s.end, at)) for s in self.speech if s.start < at]
        self.words -= self._pending_words
        self._pending_words = 0

    def files(self) -> list[str]:
        return hls.files(self.chunks.segment_count)

    def playlist(self, ended: bool) -> str:
        """The EVENT playlist of the segments written, its gaps marked (``hls.mark_gaps``)."""
        return hls.mark_gaps(self.chunks.playlist(ended=ended), self.gaps, self.request.chunk_seconds)
