"""A family's result metrics (FamilySpec.metrics): checked when declared, read from an output, alike across families."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from mediafarm.tasks import registry as families
from mediafarm.tasks.wire.result_metrics import ResultMetric
from tests.tasks.test_family import make_spec, registry  # noqa: F401 - the fixture restores the registry


class Counted(BaseModel):
    frames: dict[str, float] = {}
    text: str = ""


def examined(help: str = "Frames looked at") -> ResultMetric:
    return ResultMetric.counter("frames_total", "frames.examined", help, fate="examined")


def test_the_number_is_read_at_its_path_and_nothing_else_counts() -> None:
    metric = examined()
    assert metric.full_name == "mediafarm_frames_total" and metric.label_names == ("family", "rung", "variant", "fate")
    assert metric.value({"frames": {"examined": 12}}) == 12.0
    nothing = ({}, {"frames": None}, {"frames": {"examined": None}}, {"frames": {"examined": "12"}},
               {"frames": {"examined": True}}, {"frames": {"examined": float("nan")}}, {"frames": 3}, None)  # fmt: skip
    for output in nothing:
        assert metric.value(output) is None, output


@pytest.mark.parametrize(
    ("build", "problem"),
    [
        (lambda: ResultMetric.counter("frames", "frames.examined", "x"), "ends in '_total'"),
        (lambda: ResultMetric.counter("Frames_total", "frames.examined", "x"), "must match"),
        (lambda: ResultMetric.counter("frames_total", "frames..examined", "x"), "dotted field names"),
        (lambda: ResultMetric.counter("frames_total", "frames.examined", " "), "help line"),
        (lambda: ResultMetric.counter("frames_total", "frames.examined", "x", family="yolo"), "other than"),
        (lambda: ResultMetric.histogram("ms", "frames.ms", "x", buckets=()), "needs buckets"),
        (lambda: ResultMetric.histogram("ms", "frames.ms", "x", buckets=(10, 5)), "ascending"),
        (lambda: ResultMetric("ms_total", "frames.ms", "x", kind="gauge"), "kind must be"),  # type: ignore[arg-type]
    ],
)
def test_a_malformed_metric_is_refused_naming_the_problem(build, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        build()


def test_a_spec_refuses_a_metric_outside_its_result_or_declared_twice_differently() -> None:
    with pytest.raises(ValueError, match="'frames' is not a field of EchoResult"):
        make_spec(metrics=(examined(),))
    with pytest.raises(ValueError, match="declared twice, differently"):
        make_spec(result=Counted, metrics=(examined(), examined("Another help")))
    # One name for several numbers of one family, alike but for their labels' values: fine.
    skipped = ResultMetric.counter("frames_total", "frames.skipped", "Frames looked at", fate="skipped")
    assert make_spec(result=Counted, metrics=[examined(), skipped]).metrics == (examined(), skipped)


def test_the_registry_refuses_two_families_declaring_one_metric_differently(registry: None) -> None:  # noqa: F811
    yolo = families.get("yolo")
    assert {m.full_name for m in yolo.metrics} == {"mediafarm_frames_total", "mediafarm_model_ms_per_frame"}
    # Declared as YOLO declares it: one metric counts both families.
    alike = next(m for m in yolo.metrics if m.name == "frames_total")
    families.register(make_spec(result=Counted, metrics=(ResultMetric.counter(
        alike.name, "frames.examined", alike.help, fate="examined"),)))  # fmt: skip
    unlike = make_spec(name="echo2", task_name="farm.echo2.run", result=Counted, metrics=(examined("Other help"),))
    with pytest.raises(ValueError, match="declares metric mediafarm_frames_total unlike 'yolo' does"):
        families.register(unlike)
    assert "echo2" not in families.load()
