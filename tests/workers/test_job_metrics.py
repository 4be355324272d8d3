"""Counting an ended job from its history as Redis stores it: the breaker's and memory pressure's
skips are downgrades with their own reasons, and a job refused before any rung is a rejection."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from mediafarm.workers.job_metrics import JobMetrics


def attempt(index: int, rung: str, outcome: str, reason: str = "", **more: float) -> dict:
    return {"rung": rung, "rung_index": index, "variant": rung, "outcome": outcome, "reason": reason,
            "started": 1000.0 + index, **more}  # fmt: skip


def of_release_before(record: dict) -> dict:
    """The same attempt as the release before wrote it: ``rung`` the index, ``variant`` the name."""
    return {k: v for k, v in record.items() if k != "rung_index"} | {"rung": record["rung_index"]}


def test_skips_by_breaker_and_pressure_are_downgrades_with_their_reasons() -> None:
    registry = CollectorRegistry()
    metrics = JobMetrics(registry)
    history = [
        attempt(0, "large", "skipped", "breaker open since 2026-11-30 18:00:00 UTC, 3 failures in 60 s on pool gpu0"),
        attempt(1, "small", "skipped", "host memory 3% available; the ladder steps down under pressure (...)"),
        attempt(2, "tiny", "ok", duration=2.5, peak_rss_mb=300.0),
    ]
    metrics.observe_end("subtitle", "SUCCESS", history, first_output=1002.75)

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    def moved(first: str, then: str, reason: str) -> float | None:
        return value("mediafarm_downgrades_total", family="subtitle", from_rung=first, to_rung=then,
                     from_variant=first, to_variant=then, reason=reason)  # fmt: skip

    assert moved("large", "small", "breaker") == 1 and moved("small", "tiny", "pressure") == 1
    # The same history as the release before wrote it counts the same (a rolling upgrade).
    metrics.observe_end("subtitle", "SUCCESS", [of_release_before(a) for a in history], first_output=1002.75)
    assert moved("large", "small", "breaker") == 2 and moved("small", "tiny", "pressure") == 2
    assert value("mediafarm_jobs_total", family="subtitle", rung="tiny", variant="tiny", outcome="ok") == 2
    assert value("mediafarm_attempts_total", family="subtitle", rung="large", variant="large", outcome="skipped") == 2
    assert value("mediafarm_first_output_seconds_sum", family="subtitle", rung="tiny", variant="tiny") == 1.5
    assert value("mediafarm_attempt_seconds_sum", family="subtitle", rung="tiny", variant="tiny", outcome="ok") == 5.0
    tiny_rss = value("mediafarm_attempt_peak_rss_bytes_sum", family="subtitle", rung="tiny", variant="tiny")
    assert tiny_rss == 2 * 300 * 1024 * 1024


def test_failed_jobs_end_rejected_exhausted_or_in_error() -> None:
    registry = CollectorRegistry()
    metrics = JobMetrics(registry)
    metrics.observe_end("vad", "FAILURE", [], None, exc_type="InvalidRequest")  # refused before any rung
    metrics.observe_end("vad", "FAILURE", [attempt(0, "silero", "killed"), attempt(1, "webrtc", "oom")], None)
    metrics.observe_end("vad", "FAILURE", [attempt(0, "silero", "error", "EngineError: boom")], None)
    metrics.observe_end("vad", "REVOKED", [attempt(0, "silero", "cancelled")], None)
    ends = {(s.labels["variant"], s.labels["outcome"]): s.value for m in registry.collect() for s in m.samples
            if s.name == "mediafarm_jobs_total"}  # fmt: skip
    expected = {("-", "rejected"): 1, ("webrtc", "exhausted"): 1, ("silero", "error"): 1, ("silero", "cancelled"): 1}
    assert ends == expected


def test_failures_are_counted_by_cause_and_whether_they_counted_against_the_rung() -> None:
    registry = CollectorRegistry()
    metrics = JobMetrics(registry)
    history = [
        attempt(0, "silero-onnx", "killed", "SIGKILLed from outside: ...", counted=False, cause="outside_kill"),
        attempt(1, "webrtc", "killed", "watchdog: over the cap", counted=True, cause="watchdog_cap"),
        attempt(2, "skip", "ok"),
    ]
    metrics.observe_end("vad", "SUCCESS", history, None)
    samples = {(s.labels["variant"], s.labels["cause"], s.labels["counted"]): s.value for m in registry.collect()
               for s in m.samples if s.name == "mediafarm_rung_failures_total"}  # fmt: skip
    assert samples == {("silero-onnx", "outside_kill", "false"): 1, ("webrtc", "watchdog_cap", "true"): 1}
