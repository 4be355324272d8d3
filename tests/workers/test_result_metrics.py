"""The worker counts what a family declares of its results, under the names it always had (YOLO's frames)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from mediafarm.tasks import registry as families
from mediafarm.workers.metrics import ResultMetrics


def test_a_yolo_envelope_counts_its_frames_and_model_time_under_the_old_names() -> None:
    registry = CollectorRegistry()
    metrics = ResultMetrics(families.load().values(), registry)
    assert metrics.counts("yolo") and not metrics.counts("vad") and not metrics.counts("nope")
    frames = {"decoded": 300, "sampled": 20, "examined": 7, "skipped": 13, "model_ms_per_frame": 42.5}
    for _ in range(2):
        metrics.observe({"family": "yolo", "variant": "yolo-nano", "output": {"frames": frames}})
    # A job without the numbers (the motion rung runs no model) adds nothing to the histogram.
    no_model = {**frames, "model_ms_per_frame": None}
    metrics.observe({"family": "yolo", "variant": "motion", "output": {"frames": no_model}})

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    job = {"family": "yolo", "rung": "yolo-nano", "variant": "yolo-nano"}  # variant: for one release
    assert value("mediafarm_frames_total", fate="decoded", **job) == 600
    assert value("mediafarm_frames_total", fate="examined", **job) == 14
    assert value("mediafarm_frames_total", fate="skipped", **job) == 26
    assert value("mediafarm_frames_total", fate="sampled", **job) is None  # not declared: not counted
    assert value("mediafarm_model_ms_per_frame_count", **job) == 2
    assert value("mediafarm_model_ms_per_frame_sum", **job) == 85.0
    assert value("mediafarm_model_ms_per_frame_bucket", le="50.0", **job) == 2
    assert value("mediafarm_frames_total", fate="examined", family="yolo", rung="motion", variant="motion") == 7
    assert value("mediafarm_model_ms_per_frame_count", family="yolo", rung="motion", variant="motion") is None


def test_envelopes_of_other_families_or_other_shapes_count_nothing() -> None:
    registry = CollectorRegistry()
    metrics = ResultMetrics(families.load().values(), registry)
    for envelope in (None, [], {"family": "vad", "output": {"frames": {"examined": 5}}}, {"family": "yolo"},
                     {"family": "yolo", "output": None}, {"family": "yolo", "output": {"frames": "x"}}):  # fmt: skip
        metrics.observe(envelope)
    counted = [s for m in registry.collect() for s in m.samples if s.name == "mediafarm_frames_total"]
    assert counted == []
    # ... yet the metrics are listed (a scrape finds them before their first job).
    assert {m.name for m in registry.collect()} >= {"mediafarm_frames", "mediafarm_model_ms_per_frame"}


def test_a_subtitle_envelope_counts_its_recognition_confidence() -> None:
    registry = CollectorRegistry()
    metrics = ResultMetrics(families.load().values(), registry)
    job = {"family": "subtitle", "rung": "whisper-tiny", "variant": "whisper-tiny"}
    confidence = {"scored": 40, "mean": 0.83, "unsure_share": 0.075}
    metrics.observe({"job_id": "j", **job, "rung_index": 0, "output": {"confidence": confidence}})
    # pocketsphinx scores no word: nothing observed.
    metrics.observe({"family": "subtitle", "variant": "pocketsphinx",
                     "output": {"confidence": {"scored": 0, "mean": None, "unsure_share": None}}})  # fmt: skip
    assert registry.get_sample_value("mediafarm_recognition_word_probability_count", job) == 1
    assert registry.get_sample_value("mediafarm_recognition_word_probability_bucket", {**job, "le": "0.8"}) == 0
    assert registry.get_sample_value("mediafarm_recognition_word_probability_bucket", {**job, "le": "0.9"}) == 1
    assert registry.get_sample_value("mediafarm_recognition_unsure_share_sum", job) == 0.075
    pocketsphinx = {"family": "subtitle", "rung": "pocketsphinx", "variant": "pocketsphinx"}
    assert registry.get_sample_value("mediafarm_recognition_unsure_share_count", pocketsphinx) is None
