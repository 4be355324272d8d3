"""The cue clock of a live stream: the stream's own timestamps (PTS), not the wall clock.

Audio arrives as decoded frames, each with its PTS, and is counted in samples (16 kHz) as it is
resampled. Cue times are seconds on the *cue clock*: the stream's PTS less the PTS of the job's
first frame (its origin), less every timestamp jump seen since. Each frame's PTS re-anchors the
sample count to the stream (``anchor``): a word heard at sample ``n`` gets the time of the last
anchor before it plus the samples since, so cues follow the stream's clock even when its
timestamps and its sample count drift apart (a sender whose clock runs fast, dropped packets).

A frame whose PTS differs from where the last anchor says it should be by more than
``JUMP_SECONDS`` (the subtitles story's resync threshold, ~300 ms) is a discontinuity (a restarted
encoder, a spliced stream, a wrapped counter): it is recorded and its size added to the offset, so
the cue clock runs on without a hole or a leap, and the segments written after it carry an
``X-TIMESTAMP-MAP`` that maps them to the stream's new timestamps. Smaller differences are drift:
measured (largest and last), and followed.

Pure Python and small: the live engine keeps one per attempt, its state goes into checkpoints.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

JUMP_SECONDS = 0.3
# MPEG-TS timestamps count 90 kHz (HLS's X-TIMESTAMP-MAP states them so).
MPEGTS_HZ = 90000
# Anchors kept: enough to map the audio still held for recognition (a window of a minute or so).
KEPT_ANCHORS = 4096


class Discontinuity(BaseModel):
    """A timestamp jump in the source. Attributes: at (cue-clock seconds where it happened),
    expected (the stream PTS, in seconds, the clock expected there), found (the PTS the frame had),
    jump (found - expected, seconds)."""

    at: float
    expected: float
    found: float
    jump: float


@dataclass
class StreamClock:
    """Sample positions → cue-clock seconds, anchored to the stream's PTS.

    Attributes:
        rate: Samples a second of the decoded audio.
        origin: Stream PTS (seconds) of cue time 0; None until the first frame.
        offset: Seconds of timestamp jumps absorbed so far (PTS - origin - offset = cue time).
        discontinuities: Every jump found.
        drift_max: Largest |PTS - sample clock| seen between two anchors that was not a jump, seconds.
        drift_last: The last such difference, signed.
    """

    rate: int
    origin: float | None = None
    offset: float = 0.0
    discontinuities: list[Discontinuity] = field(default_factory=list)
    drift_max: float = 0.0
    drift_last: float = 0.0
    _samples: list[int] = field(default_factory=list)
    _times: list[float] = field(default_factory=list)

    def anchor(self, sample: int, pts: float | None) -> Discontinuity | None:
        """Frame at sample position ``sample`` carries stream time ``pts`` (seconds; None: the
        frame has none, the sample count goes on). Returns the discontinuity it makes, if any."""
        if pts is None:
            return None
        if self.origin is None:
            self.origin = pts - (sample / self.rate)
            self._add(sample, sample / self.rate)
            return None
        if not self._samples:  # an attempt that resumed: origin and offset are the earlier one's
            self._add(sample, pts - self.origin - self.offset)
            return None
        expected = self.time_at(sample)
        found = pts - self.origin - self.offset
        difference = found - expected
        if abs(difference) > JUMP_SECONDS:
            jump = Discontinuity(at=round(expected, 3), expected=round(expected + self.origin + self.offset, 3),
                                 found=round(pts, 3), jump=round(difference, 3))  # fmt: skip
            self.offset += difference
            self.discontinuities.append(jump)
            self._add(sample, expected)
            return jump
        self.drift_last = difference
        self.drift_max = max(self.drift_max, abs(difference))
        self._add(sample, found)
        return None

    @property
    def anchored(self) -> bool:
        """Has this attempt seen a frame with a PTS?"""
        return bool(self._samples)

    def hold(self, at: float) -> Discontinuity:
        """The last anchor goes to cue time ``at`` instead: the stream's timestamps went back (a
        sender restarted while no attempt read it), absorbed like any jump and recorded."""
        found = self._times[-1]
        jump = Discontinuity(at=round(at, 3), expected=round(at + (self.origin or 0.0) + self.offset, 3),
                             found=round(found + (self.origin or 0.0) + self.offset, 3), jump=round(found - at, 3))  # fmt: skip
        self.offset += found - at
        self._times[-1] = at
        self.discontinuities.append(jump)
        return jump

    def time_at(self, sample: int) -> float:
        """Cue-clock seconds of sample position ``sample`` (0 before the first anchor)."""
        if not self._samples:
            return sample / self.rate
        i = max(0, bisect.bisect_right(self._samples, sample) - 1)
        return self._times[i] + (sample - self._samples[i]) / self.rate

    def mpegts(self, at: float) -> int:
        """The stream's MPEG-TS timestamp (90 kHz, 33 bits) of cue time ``at`` under the current offset."""
        origin = self.origin or 0.0
        return round((at + origin + self.offset) * MPEGTS_HZ) % (1 << 33)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the origin and offset (anchors are the next attempt's own)."""
        return {"origin": self.origin, "offset": self.offset,
                "discontinuities": [d.model_dump() for d in self.discontinuities],
                "drift_max": self.drift_max}  # fmt: skip

    def restore(self, state: dict[str, Any]) -> None:
        """Go on from an earlier attempt's :meth:`state` (its origin and offset; anchors anew)."""
        self.origin, self.offset, self.drift_max = state["origin"], state["offset"], state["drift_max"]
        self.discontinuities = [Discontinuity(**d) for d in state["discontinuities"]]

    def _add(self, sample: int, time: float) -> None:
        if self._samples and sample <= self._samples[-1]:
            self._samples[-1], self._times[-1] = sample, time
        else:
            self._samples.append(sample)
            self._times.append(time)
        if len(self._samples) > KEPT_ANCHORS:
            del self._samples[: KEPT_ANCHORS // 2], self._times[: KEPT_ANCHORS // 2]
