"""A rung whose weights are not in FARM_MODELS_DIR is skipped before anything is charged to it.

Found from outside: ``whisper-large:unavailable → whisper-small:rejected`` on a farm without a
small model — the media check failed the job against a rung that could never have run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mediafarm.config.ladders import Ladder, rung
from mediafarm.tasks.runtime.downgrade import LadderRun, run_ladder
from mediafarm.tasks.runtime.rung_policies import Availability
from mediafarm.tasks.wire.errors import MediaNotFound, PermanentFailure
from mediafarm.tasks.wire.family import EngineSpec, Params
from mediafarm.tasks.wire.history import AttemptLog
from mediafarm.tasks.wire.records import Outcome


class ModelParams(Params):
    model: str = "default-model"


ENGINE = EngineSpec("x:y", ModelParams, weights="model")


def test_a_rung_without_its_weights_is_unavailable_naming_them(tmp_path: Path) -> None:
    (tmp_path / "small").mkdir()
    reason = ENGINE.unavailable(rung("large", "e", model="large"), tmp_path)
    assert reason == f"model 'large' is not in the models dir {tmp_path} (FARM_MODELS_DIR)"
    assert ENGINE.unavailable(rung("small", "e", model="small"), tmp_path) is None
    # The parameter's default counts like a declared value.
    assert "'default-model'" in ENGINE.unavailable(rung("plain", "e"), tmp_path)
    # Without a models dir (a producer's check) the weights are not looked for.
    assert ENGINE.unavailable(rung("large", "e", model="large")) is None


def test_a_bad_file_is_charged_to_the_first_rung_that_can_run(log: AttemptLog, tmp_path: Path) -> None:
    (tmp_path / "tiny").mkdir()
    ladder = Ladder("asr", "asr", (rung("large", "e", model="large"), rung("small", "e", model="small"),
                                   rung("tiny", "e", model="tiny")))  # fmt: skip
    ran: list[str] = []

    def run_rung(rung_: Any, index: int, attempt: int) -> Any:
        ran.append(rung_.name)
        raise MediaNotFound("talk.wav: no such file in the media roots")

    job = LadderRun(log.job_id, ladder, {"e": ENGINE}, log, worker="cpu@a", fresh=True,
                    policies=(Availability(tmp_path),))  # fmt: skip
    with pytest.raises(PermanentFailure, match="no such file"):
        run_ladder(job, run_rung)
    assert ran == ["tiny"]
    attempts, _ = log.read()
    assert [(a.rung, a.outcome) for a in attempts] == [
        ("large", Outcome.UNAVAILABLE), ("small", Outcome.UNAVAILABLE), ("tiny", Outcome.REJECTED)
    ]
    assert "'small' is not in the models dir" in attempts[1].reason
