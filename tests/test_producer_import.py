"""What a producer's ``import mediafarm`` loads, in a fresh interpreter: the client, never the worker side.

A producer service installs the core (``pip install mediafarm``): no psutil, no prometheus-client
(the ``worker`` extra), no media or model package. Loading any of them from the client would
make them producer dependencies again, and loading the worker's guards would wire worker code into
every producer process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import redis

# Top-level packages a producer process must never load (the worker side and the pools' extras).
WORKER_SIDE = ["psutil", "prometheus_client"]
HEAVY = ["torch", "av", "numpy", "soundfile", "onnxruntime", "ultralytics", "ChatTTS", "faster_whisper",
         "ctranslate2", "silero_vad", "piper", "pocketsphinx", "webrtcvad"]  # fmt: skip


def loaded_after(code: str, cwd: Path, broker_url: str) -> list[str]:
    """Every module in ``sys.modules`` after running ``code`` in a new interpreter with a producer's
    environment: no FARM_* setting of the test session but the broker, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_") and k != "PYTHONPATH"}
    env["FARM_BROKER_URL"] = broker_url
    script = textwrap.dedent(code) + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    result = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def offending(loaded: list[str]) -> dict[str, list[str]]:
    """What of ``loaded`` a producer must not have, by why."""
    return {
        "mediafarm.workers": [m for m in loaded if m == "mediafarm.workers" or m.startswith("mediafarm.workers.")],
        # The worker side of a job (the farm task, the ladder runner, the OOM killer ...): the app
        # a producer imports registers no task, so it loads none of it.
        "mediafarm.tasks.runtime": [m for m in loaded if m.startswith("mediafarm.tasks.runtime")],
        "worker side": [m for m in loaded if m.split(".")[0] in WORKER_SIDE],
        "Celery's worker control": [m for m in loaded if m.startswith("celery.worker.control")],
        "media and model packages": [m for m in loaded if m.split(".")[0] in HEAVY],
    }


def test_import_mediafarm_loads_the_client_and_no_worker_code(tmp_path: Path, redis_url: str) -> None:
    loaded = loaded_after(
        """
        import mediafarm
        from mediafarm import JobHandle, PipelineHandle, known_families, submit
        import mediafarm.tasks.producer.client
        assert callable(submit) and issubclass(PipelineHandle, JobHandle)
        # What a submit reads first: every family's spec, and with it the kit the specs import.
        assert {"vad", "tts", "subtitle", "yolo"} <= set(known_families())
        """,
        tmp_path,
        redis_url,
    )
    # The client and the app it sends with are there: the walk itself works.
    assert {"mediafarm.tasks.producer.client", "mediafarm.tasks.app", "mediafarm.tasks.producer.handles", "celery",
            "mediafarm.tasks.kit", "mediafarm.tasks.families.subtitle_live.push"} <= set(loaded)  # fmt: skip
    assert offending(loaded) == {key: [] for key in offending([])}


def test_the_farm_cli_loads_no_worker_side_until_a_worker_command_runs(tmp_path: Path, redis_url: str) -> None:
    # `farm submit`, `farm status` ... are producers' commands: the CLI module imports the worker
    # side (psutil, prometheus-client, Celery's worker control) only inside `worker`, `up` and `demo`.
    loaded = loaded_after("import mediafarm.workers.cli, mediafarm.tasks.producer.client", tmp_path, redis_url)
    assert "mediafarm.workers.cli" in loaded
    found = offending(loaded)
    assert found["worker side"] == [] and found["Celery's worker control"] == []
    assert found["media and model packages"] == []
    assert "mediafarm.workers.guards" not in loaded and "mediafarm.workers.metrics" not in loaded
    # Nor the HTTP gateway (the `gateway` extra), which `farm gateway` and `farm up` import when they run.
    assert not [m for m in loaded if m.split(".")[0] in ("fastapi", "starlette", "uvicorn", "sse_starlette")]


def test_farm_submit_and_farm_status_as_a_producer_runs_them_load_no_worker_module(tmp_path: Path,
                                                                                   redis_url: str) -> None:  # fmt: skip
    # The installed `farm` entry point, run to the end of each command: the process-control
    # commands (workers/cli.py) are loaded by name only when one of them runs.
    queue = f"producer-import-{uuid.uuid4().hex[:6]}"  # no worker consumes it
    for argv in (["submit", "tts", "Hello there.", "--queue", queue], ["status", "no-such-job"]):
        loaded = loaded_after(
            f"""
            import sys
            from mediafarm.cli.app import main
            sys.argv = ["farm", *{argv!r}]
            try:
                main()
            except SystemExit as exc:
                assert not exc.code, exc.code
            """,
            tmp_path,
            redis_url,
        )
        assert {"mediafarm.cli.jobs", "mediafarm.tasks.producer.client", "celery"} <= set(loaded)  # the command ran
        assert offending(loaded) == {key: [] for key in offending([])}, argv
        # Nor Celery's worker (its bootsteps), which Celery's Django fix-up would import with the app.
        assert [m for m in loaded if m == "celery.worker" or m.startswith(("celery.worker.", "celery.bootsteps"))] == []
    client = redis.Redis.from_url(redis_url)
    sent = list(client.scan_iter(match=f"{queue}*"))  # the queue, under its priority's name
    assert sent and client.delete(*sent) == len(sent)  # the job was sent
