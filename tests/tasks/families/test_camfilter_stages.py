"""How the cut reads its YOLO stage: classes, motion alone, or both after a resume on the motion rung."""

from __future__ import annotations

from mediafarm.tasks.families.camfilter.engines import _spans_by_reason, _stage
from mediafarm.tasks.families.vad.spec import VadResult
from mediafarm.tasks.families.yolo.spec import Detection, MadeWithModel, YoloResult
from mediafarm.tasks.kit import Span


def found(start: float, end: float) -> Detection:
    return Detection(start=start, end=end, peak_confidence=0.5, box=(0, 0, 1, 1), frames=2)


def test_a_yolo_stage_resumed_on_its_motion_rung_gives_its_class_spans_and_motion_after_the_join() -> None:
    made = [MadeWithModel(start=0, end=20, rung="yolo-nano", model="yolo11n"),
            MadeWithModel(start=20, end=60, rung="motion", model="motion prefilter")]  # fmt: skip
    yolo = YoloResult(detections={"person": [found(3, 6)], "motion": [found(30, 34)]}, duration=60, made=made)
    spans = _spans_by_reason(VadResult(spans=[], duration=60), yolo, ["person"])
    assert spans == {"speech": [], "person": [Span(3, 6)], "motion": [Span(30, 34)]}
    envelope = {"job_id": "j.yolo", "rung": "motion", "rung_index": 1, "variant": "motion"}
    assert _stage(envelope, yolo).flags == ["motion_part"]


def test_a_yolo_stage_on_one_model_rung_gives_its_classes_alone() -> None:
    yolo = YoloResult(detections={"person": [found(3, 6)]}, duration=60)
    spans = _spans_by_reason(VadResult(spans=[], duration=60), yolo, ["person"])
    assert spans == {"speech": [], "person": [Span(3, 6)]}
    assert _stage({"job_id": "j.yolo"}, yolo).flags == []


def test_a_stage_stored_by_the_release_before_reads_with_its_rung_and_its_attempts_rungs() -> None:
    from mediafarm.tasks.families.camfilter.spec import StageOut

    old = {"job_id": "j.vad", "variant": "silero-onnx", "attempts": [{"rung": 0, "variant": "silero-onnx"}]}
    stage = StageOut.model_validate(old)
    assert (stage.rung, stage.attempts[0]["rung"], stage.attempts[0]["rung_index"]) == ("silero-onnx", "silero-onnx", 0)
