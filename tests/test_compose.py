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


def test_no_farm_service_shares_a_storage_folder_they_share_the_object_store(compose: dict) -> None:
    services = compose["services"]
    farm = {name: svc for name, svc in services.items() if str(svc.get("image", "")).startswith("mediafarm:")}
    assert {"gateway", "flower", "worker-cpu", "worker-gpu0"} <= set(farm)
    storage = {name: svc["environment"]["FARM_STORAGE_DIR"] for name, svc in farm.items()}
    for name, svc in farm.items():
        env = svc["environment"]
        assert env["FARM_STORAGE_URL"] == "s3://farm/jobs" and env["AWS_ENDPOINT_URL"] == "http://objects:8333", name
        mounted = [str(v).split(":")[1] for v in svc.get("volumes", []) if ":" in str(v)]
        assert storage[name] not in mounted, f"{name} mounts its storage folder: only the store is shared"
    # The store's bucket is the one FARM_STORAGE_URL names, made as the store starts.
    objects = services["objects"]
    assert "-bucket=farm" in objects["command"][0] and "objects-data:/data" in objects["volumes"]
    assert "storage" not in compose["volumes"]


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


DEPLOY = REPO / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "mediafarm.json"
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported_series() -> set[str]:
    """Every series name a worker or the gateway can serve, from the metrics' own declarations."""
    from prometheus_client import REGISTRY

    from mediafarm.gateway.metrics import GatewayMetrics
    from mediafarm.tasks.producer.scaling_metrics import PoolScaling
    from mediafarm.workers import metrics
    from mediafarm.workers.collectors import FarmState, GpuChildren, GpuMemory, QueueDepth

    metrics.result_metrics()
    metrics.job_metrics()
    collectors = [QueueDepth(None, list), FarmState(None, "p", list), GpuMemory(()), GpuChildren(None, str, "p"),
                  PoolScaling(None, dict)]  # fmt: skip
    families = [*REGISTRY.collect(), *GatewayMetrics().registry.collect(), *(m for c in collectors for m in c.describe())]
    return {f.name + suffix for f in families if f.name.startswith("mediafarm_") for suffix in _SUFFIXES[f.type]}


def test_the_dashboard_asks_only_for_series_the_farm_serves() -> None:
    import re

    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    asked = {name for expr in exprs for name in re.findall(r"\bmediafarm_[a-z0-9_]+", expr)}
    served = exported_series()
    assert "mediafarm_downgrades_total" in served and "mediafarm_queue_wait_seconds_bucket" in served
    assert asked - served == set()
    # ... and it shows what issue 15 asks to see from outside.
    for name in ("mediafarm_jobs_total", "mediafarm_downgrades_total", "mediafarm_queue_depth",
                 "mediafarm_queue_wait_seconds_bucket", "mediafarm_breaker_state", "mediafarm_admission_refusals_total",
                 "mediafarm_child_kills_total", "mediafarm_gpu_allocator_fragmentation"):  # fmt: skip
        assert name in asked, f"the dashboard shows no {name}"
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    # It groups by the rung's name as the farm now labels it, not by `variant`, which the series
    # carry for one release only (docs/operating.md, "Upgrading to one name per rung").
    assert not re.search(r"\bvariant\b|_variant\b", DASHBOARD.read_text()), "the dashboard still reads variant"


def test_prometheus_and_grafana_are_provisioned_from_the_repos_files(compose: dict) -> None:
    services = compose["services"]
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), f"{name} mounts {source}, which is not in the repository"
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    workers = next(job for job in scrape["scrape_configs"] if job["job_name"] == "mediafarm-workers")
    discovered = {name for sd in workers["dns_sd_configs"] for name in sd["names"]}
    assert discovered == set(worker_services(compose))
    for name, svc in worker_services(compose).items():
        assert svc["environment"]["FARM_METRICS_PORT"] == str(workers["dns_sd_configs"][0]["port"]), name
    datasource = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    uid = datasource["datasources"][0]["uid"]
    dashboard = json.loads(DASHBOARD.read_text())
    assert {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]} == {uid}


def test_the_gateway_listens_beyond_loopback_only_with_tokens(compose: dict) -> None:
    gateway = compose["services"]["gateway"]
    assert gateway["command"][:3] == ["gateway", "--host", "0.0.0.0"]
    # Compose refuses to start without them (${VAR:?message}), rather than a gateway refusing in a loop.
    assert gateway["environment"]["FARM_API_TOKENS"].startswith("${FARM_API_TOKENS:?")


def _extra_closure(extra: str) -> set[str]:  # "vad,flower": several
    """The distributions an install of ``mediafarm[extra]`` brings (normalised names): the extras'
    own requirements from pyproject.toml, then each distribution's requirements from the metadata of
    this venv (which holds every family's packages), markers for this Python honoured."""
    import re
    import tomllib
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement

    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    todo, seen_extras, dists = extra.split(","), set(), set()
    while todo:
        name = todo.pop()
        if name in seen_extras:
            continue
        seen_extras.add(name)
        for line in extras[name]:
            req = Requirement(line)
            if norm(req.name) == "mediafarm":
                todo += sorted(req.extras)
            else:
                dists.add(norm(req.name))
    pending = list(dists)
    while pending:
        try:
            lines = requires(pending.pop()) or []
        except PackageNotFoundError:
            continue
        for line in lines:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                if norm(req.name) not in dists:
                    dists.add(norm(req.name))
                    pending.append(norm(req.name))
    return dists


def cpu_image(compose: dict) -> tuple[set[str], dict]:
    args = compose["services"]["worker-cpu"]["build"]["args"]
    dists = _extra_closure(args["EXTRAS"])
    from packaging.requirements import Requirement

    return dists | {Requirement(r).name.lower() for r in args.get("NO_DEPS", "").split()}, args


def test_the_cpu_image_has_no_torch_and_silero_at_the_vad_extras_pin(compose: dict) -> None:
    import tomllib

    dists, args = cpu_image(compose)
    assert args["TORCH_VERSION"] == "" and not {"torch", "torchvision", "torchaudio"} & dists, sorted(dists)
    vad = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vad"]
    pinned = next(r for r in vad if r.startswith("silero-vad"))
    assert args["NO_DEPS"] == "silero-vad" + pinned[pinned.index("==") :], (args["NO_DEPS"], pinned)


def test_the_cpu_image_runs_a_rung_of_every_family_its_pool_consumes(compose: dict) -> None:
    """Issue #36's CPU worker consumed subtitle, tts and yolo with only the vad,flower,gateway extras
    installed: every transcription failed with NoRungLeft. Each family the cpu pool consumes must have
    a rung the image can run with no weights mounted (no CUDA, no operator's model)."""
    from importlib.metadata import packages_distributions

    from mediafarm.config.pools import expand_queues
    from mediafarm.tasks import registry

    dists, _ = cpu_image(compose)
    module_dists = {m: {d.lower().replace("_", "-") for d in ds} for m, ds in packages_distributions().items()}
    command = compose["services"]["worker-cpu"]["command"]
    pool = get_pools()[command[command.index("--pool") + 1]]
    builtin = [s for s in registry.load().values() if s.engines and type(s).__module__.startswith("mediafarm")]
    consumed = set(expand_queues(pool.queues, [s.queue for s in builtin if s.in_default_pools]))
    assert {"vad", "subtitle", "tts", "yolo"} <= consumed
    for spec in builtin:
        if spec.queue not in consumed:
            continue
        runnable = [
            rung.name for ladder in registry.ladders_of(spec) for rung in ladder.rungs
            if rung.device != "cuda" and spec.engines[rung.engine].weights is None
            and all(module_dists.get(m, {m}) & dists for m in spec.engines[rung.engine].needs)
        ]  # fmt: skip
        assert runnable, f"the cpu image runs no rung of {spec.name}, which its pool consumes"
