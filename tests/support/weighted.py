"""A test-only family whose one rung needs a weights file, for the capability and rerouting tests.

Registered only in the workers and ``farm`` commands of tests/integration/test_capability.py
(their ``FARM_FAMILY_MODULES``), so its queue, ``weighted``, is consumed by no other test's worker:
two workers told apart by their models folder (with and without ``weighted.bin``) are the whole
cluster for it. The engine reads the file, as a model loader would.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from mediafarm.tasks.kit import EngineContext, EngineSpec, FamilySpec, Params, Request, TimeLimits, rung

WEIGHTS = "weighted.bin"


class WeightedRequest(Request):
    text: str = "hello"


class WeightedResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    text: str
    weights_bytes: int


class WeightedParams(Params):
    file: str = WEIGHTS


def read_weights(ctx: EngineContext, request: WeightedRequest, params: WeightedParams) -> WeightedResult:
    return WeightedResult(text=request.text, weights_bytes=ctx.model_path(params.file).stat().st_size)


FAMILY = FamilySpec(
    name="weighted",
    task_name="farm.test.weighted",
    description="Test-only: answers only where its weights file is in the models folder",
    request=WeightedRequest,
    result=WeightedResult,
    engines={"read": EngineSpec(f"{__name__}:read_weights", WeightedParams, weights="file")},
    ladder=(rung("from-file", "read"),),
    limits=TimeLimits(soft=30, hard=45),
    # Only the workers of its tests take its queue.
    in_default_pools=False,
)
