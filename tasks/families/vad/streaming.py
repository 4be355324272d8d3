"""silero-vad over audio as it arrives: the VAD family's model and span rules for a live stream.

The file engine (``engines.silero``) runs the model once per decoded 10 s block. A live stream
cannot wait for 10 s, so this runs it every ``batch`` windows (~0.16 s at 5), carrying the LSTM's
state and each window's context from call to call: the probabilities are the file engine's, window
for window, and so are the spans (``SpanTracker``). The live subtitle engine feeds it.
"""

from __future__ import annotations

import numpy as np

from mediafarm.tasks.families.vad.engines import SILERO_CONTEXT, SILERO_WINDOW, SpanTracker, silero_model, with_context
from mediafarm.tasks.families.vad.spec import SileroParams


class StreamingSilero:
    """Spans in samples of the stream fed (0 = its first sample). Attributes: fed (samples the
    tracker has decided on; up to ``batch`` windows more wait in a carry)."""

    def __init__(self, params: SileroParams, batch: int = 5) -> None:
        self.session = silero_model()
        self.tracker = SpanTracker(params)
        self.batch = batch
        self.h = np.zeros((1, 1, 128), dtype=np.float32)
        self.c = np.zeros((1, 1, 128), dtype=np.float32)
        self.context = np.zeros(SILERO_CONTEXT, dtype=np.float32)
        self.carry = np.zeros(0, dtype=np.float32)
        self.fed = 0

    def feed(self, samples: np.ndarray) -> list[tuple[int, int]]:
        """Take ``samples`` (float32, 16 kHz); the spans this closed (start, end samples)."""
        block = np.concatenate([self.carry, samples]) if self.carry.size else samples
        usable = block.size - block.size % (SILERO_WINDOW * self.batch)
        self.carry = block[usable:]
        if not usable:
            return []
        rows, self.context = with_context(block[:usable].reshape(-1, SILERO_WINDOW), self.context)
        probabilities, self.h, self.c = self.session.run(
            ["speech_probs", "hn", "cn"], {"input": rows, "h": self.h, "c": self.c}
        )
        before = len(self.tracker.spans)
        self.tracker.feed(probabilities.reshape(-1).tolist())
        self.fed += usable
        return list(self.tracker.spans[before:])

    @property
    def open_start(self) -> int | None:
        """Start (samples) of the span the VAD is inside now, if any."""
        return self.tracker.start if self.tracker.triggered else None

    def cut_open(self, at: int) -> tuple[int, int] | None:
        """Close the open span at ``at`` and open a new one there (a span too long to wait for)."""
        return self.tracker.cut(at)

    def finish(self) -> tuple[int, int] | None:
        """The span open at the end of the stream, closed there."""
        return self.tracker.close(self.fed + self.carry.size)
