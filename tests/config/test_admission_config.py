"""The [admission] table, the pressure thresholds a reading is judged by, and the priority scale."""

from __future__ import annotations

import pytest

from mediafarm.config.admission import parse
from mediafarm.config.file import ConfigFileError
from mediafarm.config.priorities import checked_priority, wire_priority
from mediafarm.tasks.producer.admission import Reading


def test_defaults_family_and_pool_tables_and_mistakes_named() -> None:
    settings = parse({"max_queued": 500, "min_available_mb": 512, "families": {"tts": {"max_queued": 50}},
                      "pools": {"gpu0": {"min_gpu_free_mb": 1024}}})  # fmt: skip
    assert settings.enabled and settings.family("vad").max_queued == 500
    assert settings.family("tts").max_queued == 50 and settings.family("tts").max_queued_per_tenant == 200
    assert settings.pool("gpu0").min_gpu_free_mb == 1024 and settings.pool("gpu0").min_available_mb == 512
    assert parse({}).family("vad").max_queued == 1000 and parse({}).pool("cpu").min_available_fraction == 0.05
    with pytest.raises(ConfigFileError, match=r"\[admission.families.tts\]: unknown keys \['max_queue'\]"):
        parse({"families": {"tts": {"max_queue": 5}}})
    with pytest.raises(ConfigFileError, match="must be >= 0"):
        parse({"max_queued": -1})
    with pytest.raises(ConfigFileError, match=r"\[admission.pools.cpu\]: min_available_mb must be a number, got '1G'"):
        parse({"pools": {"cpu": {"min_available_mb": "1G"}}})
    with pytest.raises(ConfigFileError, match="enabled must be true or false"):
        parse({"enabled": "no"})


def test_a_reading_is_under_pressure_by_memory_share_or_gpu_free() -> None:
    limits = parse({"pools": {"gpu0": {"min_available_mb": 256, "min_available_fraction": 0.1,
                                       "min_gpu_free_mb": 1000}}}).pool("gpu0")  # fmt: skip
    healthy = Reading("w", 0.0, 4000, 16000, {"0": [5000, 24000]})
    assert healthy.pressure(limits) is None
    short = Reading("w", 0.0, 1500, 16000, {})  # above 256 MiB, below 10 % of 16000
    assert short.pressure(limits) == "1500 MiB of 16000 MiB memory available on w, below 1600 MiB"
    gpu = Reading("w", 0.0, 4000, 16000, {"0": [800, 24000]})
    assert gpu.pressure(limits) == "GPU 0 of w has 800 MiB free of 24000 MiB, below 1000 MiB"
    assert Reading.from_json(gpu.to_json()) == gpu


def test_the_priority_scale_and_what_each_broker_is_sent() -> None:
    assert [wire_priority(p, rabbitmq=False) for p in (0, 4, 9)] == [9, 5, 0]  # kombu's Redis: 0 first
    assert [wire_priority(p, rabbitmq=True) for p in (0, 4, 9)] == [0, 4, 9]
    for bad in (-1, 10, 4.5, True, "7"):
        with pytest.raises(ValueError, match="priority must be an integer from 0 to 9"):
            checked_priority(bad)


def test_a_mistake_in_the_admission_table_is_a_start_problem(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Read lazily by submit, it would refuse every job one by one: the worker and the gateway
    # check it at start instead (workers.guards.startup_problems, `farm gateway`).
    from mediafarm.config.admission import admission_problems, get_admission
    from mediafarm.config.settings import get_settings

    try:
        cases = (("[admission]\nmax_queued = 10\n", []),
                 ("[admission.families.tts]\nmax_queue = 5\n", ["unknown keys ['max_queue']"]))  # fmt: skip
        for n, (body, expected) in enumerate(cases):
            path = tmp_path / f"farm-{n}.toml"  # a file is read once per process (config.file)
            path.write_text(body)
            monkeypatch.setenv("FARM_CONFIG_FILE", str(path))
            get_settings.cache_clear()
            get_admission.cache_clear()
            problems = admission_problems()
            assert len(problems) == len(expected) and all(e in p for e, p in zip(expected, problems, strict=True))
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
        get_admission.cache_clear()
