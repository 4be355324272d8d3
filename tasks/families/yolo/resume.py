"""Checkpoints of a YOLO pass (``tasks.wire.checkpoint``): where it stopped, and how the next attempt
goes on from there as if it had never stopped.

A checkpoint is written between two samples, at a point the pass can go on from exactly:

- ``at``: the resume point, the oldest sample the motion gate still holds undecided (a "before"
  frame that motion in the next sample would send to the model), or the next sample's slot when
  it holds none. Every frame before it was examined or skipped for good: the intervals so far
  are final up to there, but for the open ones, which later hits may still extend.
- The motion gate's learnt state, its background and previous frame (~70 KB at the default 160 px)
  in a kept file, bit for bit: a background rebuilt from a run-in of earlier frames is only close,
  and a pixel near the threshold then flips a frame's motion, so the model would look at other
  frames than a pass never stopped. Its decisions (the margin after motion, skips) and the
  intervals go in the JSON state.

The next attempt seeks to the keyframe before ``at`` and decodes on from there (the run-in):
frames before ``at`` are decoded, never converted; the held samples come again and are offered
to the gate again, as judged before (the gate's learnt state already has them). On the same
rung, or any rung with the same stride and motion width, the result is the one a pass never
stopped gives: the same detections, intervals and frame counts.

Another rung may compare frames at another stride or width. At another stride, the held samples
are not on its grid: it starts at the next slot, and they count as skipped. At another width the
learnt state does not fit: a fresh gate learns from ``RUN_IN_S`` seconds of samples before the
resume point (fed to the gate only, never examined), which brings it within a few grey levels of
a gate that ran from the start (docs/families/yolo.md has the measure).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mediafarm.tasks.families.yolo.frames import SLOT_TOLERANCE, Sample, VideoSamples, scaled_size
from mediafarm.tasks.families.yolo.motion import Gated, MotionDetector
from mediafarm.tasks.families.yolo.spec import MadeWithModel
from mediafarm.tasks.families.yolo.tracks import IntervalBuilder
from mediafarm.tasks.kit import EngineContext, made_until

log = logging.getLogger(__name__)

# The state's own format: a checkpoint of another version is not resumed from (the pass starts over).
STATE_VERSION = 1
# The motion gate's learnt frames, kept with the checkpoint; removed before the job's result.
GATE_FILE = "resume/motion-gate.npz"
# Seconds of samples a fresh motion gate learns from before a resume point it cannot carry its
# state to (another motion width): with the default 0.05 weight a sample, 60 samples leave 5 %
# of what the fresh gate started from.
RUN_IN_S = 30.0


@dataclass
class Carried:
    """What an attempt takes over from the checkpoint it resumes from.

    Attributes:
        at: The resume point (seconds).
        replay_to: Samples up to this time were judged before (held by the gate, no motion): the
            gate gets them again, the learnt state does not. -1: none.
        gate: The gate's decisions (``MotionGate.state``), None from a pass without a gate.
        skipped: Samples skipped for good before ``at``.
        examined, model_seconds: Model calls before ``at`` and their wall time.
        moving: Samples with motion before ``at`` (the ``motion`` rung's count).
        models: Rung → its model's label, for the result's ``made``.
    """

    at: float = 0.0
    replay_to: float = -1.0
    gate: dict[str, Any] | None = None
    skipped: int = 0
    examined: int = 0
    model_seconds: float = 0.0
    moving: int = 0
    models: dict[str, str] = field(default_factory=dict)


def take_over(ctx: EngineContext, video: VideoSamples, motion: MotionDetector, tracks: IntervalBuilder) -> Carried:
    """Set ``video``, ``motion`` and ``tracks`` where ``ctx.resume`` left them; a fresh pass
    (nothing to resume, or a state this engine does not read) changes nothing."""
    checkpoint = ctx.resume
    if checkpoint is None:
        return Carried()
    state = checkpoint.state
    if state.get("version") != STATE_VERSION:
        log.warning("job %s: checkpoint state version %r, this engine reads %s: starting over",
                    ctx.job_id, state.get("version"), STATE_VERSION)  # fmt: skip
        return Carried()
    at, held = float(state["at"]), [float(t) for t in state["held"]]
    same_grid = abs(float(state["stride"]) - video.stride) < 1e-9
    if not same_grid:
        at = float(state["next_slot"])  # the held samples are not on this stride's grid
    learnt = _load_gate(ctx, scaled_size(video.width, video.height, video.grey_width))
    if learnt is not None:
        motion.load(*learnt)
    video.resume(
        at, origin=float(state["origin"]), decoded=int(state["decoded"]), counted_after=float(state["counted_after"]),
        sampled=int(state["sampled"]) + (0 if same_grid else len(held)),
        run_in_from=None if learnt is not None else max(0.0, at - RUN_IN_S),
    )  # fmt: skip
    tracks.restore(state["tracks"])
    log.info("job %s: resuming at %.3f s (checkpoint of rung %s, %s)", ctx.job_id, at, checkpoint.rung,
             "learnt state carried" if learnt is not None else f"{RUN_IN_S:.0f} s run-in")  # fmt: skip
    return Carried(
        at=at, replay_to=held[-1] if held and same_grid and learnt is not None else -1.0, gate=state.get("gate"),
        skipped=int(state["skipped"]) + (0 if same_grid else len(held)), examined=int(state["examined"]),
        model_seconds=float(state["model_seconds"]), moving=int(state.get("moving", 0)), models=dict(state["models"]),
    )  # fmt: skip


def keep(
    ctx: EngineContext,
    video: VideoSamples,
    motion: MotionDetector,
    tracks: IntervalBuilder,
    *,
    held: list[Gated[Sample]],
    gate: dict[str, Any] | None,
    skipped: int,
    examined: int,
    model_seconds: float,
    models: dict[str, str],
    moving: int = 0,
) -> None:
    """Write a checkpoint of the pass as it stands between two samples (``held``: the gate's
    undecided ones, oldest first). Failing to write one costs the job nothing but the checkpoint."""
    learnt = motion.arrays()
    if learnt is None or video.origin is None:
        return
    if held:
        first = held[0].item
        at, decoded, counted_after = first.t, first.frame - 1, first.t - SLOT_TOLERANCE
    else:
        at, decoded, counted_after = video.next_slot, video.decoded, video.position
    state = {
        "version": STATE_VERSION, "at": at, "next_slot": video.next_slot, "held": [h.t for h in held],
        "stride": video.stride, "origin": video.origin, "decoded": decoded, "counted_after": counted_after,
        "sampled": video.sampled - len(held), "skipped": skipped, "gate": gate, "examined": examined,
        "model_seconds": model_seconds, "moving": moving, "models": models, "tracks": tracks.state(),
    }  # fmt: skip
    try:
        with ctx.artifacts.open(GATE_FILE, "wb") as fh:
            np.savez(fh, background=learnt["background"], previous=learnt["previous"])
    except OSError:
        log.warning("job %s: could not keep the motion gate's state; no checkpoint this time", ctx.job_id,
                    exc_info=True)  # fmt: skip
        return
    ctx.checkpoint(at, state, files=[GATE_FILE])


def made(ctx: EngineContext, carried: Carried, end: float, model: str) -> list[MadeWithModel]:
    """Which rung made which stretch of the video: the checkpoint's parts, then this attempt's
    (from where the checkpoint's parts end: samples a rung of another stride passed over there,
    held at the checkpoint, off its grid, count as its skips)."""
    models = {**carried.models, ctx.rung: model}
    resumed = ctx.resume if carried.models else None  # None: this attempt started over
    return [MadeWithModel(round(m.start, 3), round(m.end, 3), m.rung, models.get(m.rung, ""))
            for m in made_until(resumed, ctx.rung, end)]  # fmt: skip


def drop_kept(ctx: EngineContext) -> None:
    """The gate's file is the checkpoint's, not the job's: out of the folder before the result lists it."""
    path = ctx.artifacts.path(GATE_FILE)
    path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()
    except OSError:
        pass  # not there, or not empty


def _load_gate(ctx: EngineContext, size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray] | None:
    """The kept learnt state, if it fits frames of ``size`` (width, height) at this rung."""
    try:
        with np.load(ctx.artifacts.path(GATE_FILE)) as kept:
            background, previous = kept["background"], kept["previous"]
    except (OSError, KeyError, ValueError):
        return None
    width, height = size
    if background.shape != (height, width) or previous.shape != (height, width):
        return None  # another motion width: a run-in rebuilds it
    return background, previous
