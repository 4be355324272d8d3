"""docker-compose.yml: no Docker engine runs here, so the file is checked, not run.

Structure against the farm's own declarations (always), and against the Compose specification's
JSON schema when it is present: `.ci/run` extracts the schema that the docker-compose 1.29.2 wheel
ships (compose/config/compose_spec.json, 2021) into `.cache/compose_spec.json`. That schema
predates the top-level `name:` key, so the file does not use it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from mediafarm.config.pools import get_pools
from tests.conftest import REPO

COMPOSE = REPO / "docker-compose.yml"
SCHEMA = Path(os.environ.get("FARM_COMPOSE_SCHEMA", REPO / ".cache" / "compose_spec.json"))


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def worker_services(compose: dict) -> dict[str, dict]:
    return {name: svc for name, svc in compose["services"].items() if name.startswith("worker-")}


def test_every_worker_runs_a_declared_pool_with_its_gpus(compose: dict) -> None:
    pools = get_pools()
    workers = worker_services(compose)
    assert workers, "no worker service"
    for name, svc in workers.items():
        command = svc["command"]
        pool = pools[command[command.index("--pool") + 1]]
        devices = svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        reserved = sorted(int(i) for d in devices for i in d.get("device_ids", []))
        assert reserved == sorted(pool.gpus), f"{name}: reserves GPUs {reserved}, pool {pool.name} uses {pool.gpus}"
        assert svc["environment"]["FARM_BROKER_URL"].startswith("redis://redis:")
        assert "storage:/storage" in svc["volumes"]


def test_redis_keeps_an_append_only_file_and_ports_stay_on_loopback(compose: dict) -> None:
    redis = compose["services"]["redis"]
    assert "--appendonly" in redis["command"] and redis["command"][redis["command"].index("--appendonly") + 1] == "yes"
    for name, svc in compose["services"].items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


@pytest.mark.skipif(not SCHEMA.is_file(), reason=f"Compose JSON schema not at {SCHEMA} (.ci/run extracts it)")
def test_compose_file_matches_the_compose_schema(compose: dict) -> None:
    import jsonschema

    validator = jsonschema.Draft201909Validator(json.loads(SCHEMA.read_text()))
    errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(compose)]
    assert errors == []
    broken = {**compose, "services": {**compose["services"], "redis": {**compose["services"]["redis"], "restart": 5}}}
    assert list(validator.iter_errors(broken)), "the schema check accepts a broken file"
