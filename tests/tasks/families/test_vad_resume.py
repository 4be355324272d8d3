"""VAD jobs resumed from their checkpoints (issue #19), the engines as plain functions: a resumed
silero run equals one never stopped, from any checkpoint; another rung takes over with no split
span, no overlap and a record of who made what. The kills themselves: tests/integration."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from mediafarm.tasks.families.vad.engines import silero, skip, webrtc
from mediafarm.tasks.families.vad.spec import SileroParams, VadRequest, WebrtcParams
from mediafarm.tasks.runtime.context import EngineContext
from mediafarm.tasks.wire.artifacts import ArtifactStore
from mediafarm.tasks.wire.checkpoint import Checkpoint, CheckpointWriter, store_for
from tests.support.speech import write_long_track

PARAMS = SileroParams(threshold=0.5, min_silence_ms=300, speech_pad_ms=30)


@pytest.fixture(scope="module")
def long_track(speech_track, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("vad-resume") / "long.wav"
    write_long_track(path, 195.0, speech_track)  # twenty 10 s blocks, the last one short
    return path


def context(tmp_path: Path, rung: str, resume: Checkpoint | None = None) -> tuple[EngineContext, list[Checkpoint]]:
    """A local context that keeps a checkpoint after every block it may (interval 0), and the
    list they are recorded in."""
    ctx = replace(EngineContext.local(storage_dir=tmp_path), rung=rung, resume=resume)
    store = store_for(ArtifactStore(tmp_path, "local"), "vad", {"media": "long.wav"})
    writer = CheckpointWriter(store, "seconds", rung, interval=0.0, resumed=resume)
    written: list[Checkpoint] = []
    save = writer.write

    def write(position, state, files=()):
        written.append(save(position, state, files))
        return written[-1]

    writer.write = write  # type: ignore[method-assign]
    ctx.checkpoints = writer
    return ctx, written


def test_silero_resumed_from_any_checkpoint_equals_a_run_never_stopped(long_track, tmp_path) -> None:
    request = VadRequest(media=str(long_track))
    ctx, written = context(tmp_path / "whole", "silero-onnx")
    whole = silero(ctx, request, PARAMS)
    assert len(written) >= 4 and whole.made == []
    assert [c.position for c in written] == sorted({c.position for c in written})
    for checkpoint in written:
        # Only between spans: no span is open at a checkpoint, none is split at a resume point.
        assert not any(s.start < checkpoint.position < s.end for s in whole.spans), checkpoint.position
        resumed = silero(context(tmp_path / f"at-{checkpoint.position}", "silero-b", checkpoint)[0], request, PARAMS)
        assert resumed.spans == whole.spans and resumed.duration == whole.duration
        assert [(m.start, m.end, m.rung) for m in resumed.made] == [
            (0.0, checkpoint.position, "silero-onnx"), (checkpoint.position, whole.duration, "silero-b")]


def test_silero_killed_twice_resumes_twice_and_still_equals_the_whole(long_track, tmp_path) -> None:
    request = VadRequest(media=str(long_track))
    ctx, written = context(tmp_path / "whole", "a")
    whole = silero(ctx, request, PARAMS)
    early = written[1]
    ctx_b, written_b = context(tmp_path / "b", "b", early)
    silero(ctx_b, request, PARAMS)
    later = written_b[-2]  # b's own checkpoint, its parts a then b
    assert later.position > early.position and later.made[0].rung == "a"
    resumed = silero(context(tmp_path / "c", "c", later)[0], request, PARAMS)
    assert resumed.spans == whole.spans
    assert [(m.start, m.end, m.rung) for m in resumed.made] == [
        (0.0, early.position, "a"), (early.position, later.position, "b"), (later.position, whole.duration, "c")]


def test_another_rung_takes_over_at_the_checkpoint_without_overlap(long_track, tmp_path) -> None:
    request = VadRequest(media=str(long_track))
    ctx, written = context(tmp_path / "whole", "silero-onnx")
    whole = silero(ctx, request, PARAMS)
    checkpoint = written[len(written) // 2]
    at = checkpoint.position
    for name, engine, params in (("webrtc", webrtc, WebrtcParams()),
                                 ("silero-strict", silero, SileroParams(threshold=0.8))):  # fmt: skip
        result = engine(context(tmp_path / name, name, checkpoint)[0], request, params)
        assert [s for s in result.spans if s.end <= at] == [s for s in whole.spans if s.end <= at]
        after = [s for s in result.spans if s.end > at]
        assert after and all(s.start >= at for s in after), (name, at, after)
        assert all(a.end <= b.start for a, b in zip(result.spans, result.spans[1:], strict=False))
        assert [(m.start, m.end, m.rung) for m in result.made] == [
            (0.0, at, "silero-onnx"), (at, result.duration, name)]
    mixed = webrtc(context(tmp_path / "w2", "webrtc", checkpoint)[0], request, WebrtcParams())
    assert mixed.model.startswith("silero-vad") and "webrtcvad" in mixed.model


def test_skip_after_a_checkpoint_keeps_what_was_made_and_says_the_rest_was_not_examined(long_track, tmp_path) -> None:
    request = VadRequest(media=str(long_track))
    ctx, written = context(tmp_path / "whole", "silero-onnx")
    whole = silero(ctx, request, PARAMS)
    checkpoint = written[2]
    result = skip(context(tmp_path / "skip", "skip", checkpoint)[0], request, None)
    assert result.vad_skipped and result.spans == [s for s in whole.spans if s.end <= checkpoint.position]
    assert [m.rung for m in result.made] == ["silero-onnx", "skip"]


def test_a_run_inside_another_job_neither_reads_nor_writes_checkpoints(long_track, tmp_path) -> None:
    request = VadRequest(media=str(long_track))
    ctx, written = context(tmp_path / "whole", "silero-onnx")
    whole = silero(ctx, request, PARAMS)
    foreign, kept = context(tmp_path / "foreign", "whisper", written[2])
    inside = silero(foreign, request, PARAMS, resumable=False)
    assert inside.spans == whole.spans and inside.made == [] and kept == []


def test_a_state_of_another_format_starts_over(long_track, tmp_path) -> None:
    request = VadRequest(media=str(long_track))
    ctx, written = context(tmp_path / "whole", "silero-onnx")
    whole = silero(ctx, request, PARAMS)
    odd = replace(written[2], state={**written[2].state, "vad": 999})
    again = silero(context(tmp_path / "odd", "b", odd)[0], request, PARAMS)
    assert again.spans == whole.spans and again.made == []
