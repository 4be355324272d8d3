"""Every service of docker-compose.yml up and healthy in the cluster ``scripts/cluster.sh up`` started:
each service's own command runs in the built image (the working-folder shadowing of issue #28 made
flower and the worker crash at start), the worker says which queues and pool it serves, and Flower
knows it."""

from __future__ import annotations

import json
import time

import httpx
import pytest
import yaml

from tests.cluster.conftest import Cluster
from tests.conftest import REPO

pytestmark = pytest.mark.cluster


def started_services() -> list[str]:
    """The default profile's services (Grafana only where its image is here: it has no stand-in)."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return [name for name, svc in compose["services"].items() if not svc.get("profiles") and name != "grafana"]


@pytest.mark.parametrize("service", started_services())
def test_every_service_runs_its_command_and_is_healthy(cluster: Cluster, service: str) -> None:
    name = cluster.container(service)
    state = json.loads(cluster.podman("inspect", name).stdout)[0]
    assert state["State"]["Status"] == "running", cluster.logs(service)[-3000:]
    # Not crash-looping under the restart policy: a command that dies at start shows here.
    assert state["RestartCount"] == 0, cluster.logs(service)[-3000:]
    if state["Config"].get("Healthcheck"):
        check = cluster.podman("healthcheck", "run", name, check=False)
        assert check.returncode == 0, f"{service}: healthcheck failed: {check.stdout}{check.stderr}"


def test_no_farm_container_shares_its_storage_folder(cluster: Cluster) -> None:
    """The gateway, Flower and the worker keep the farm's files in the objects service only: each
    one's /storage is its own (no volume, no bind), as on hosts that share only the broker."""
    for service in ("gateway", "flower", "worker-cpu"):
        [state] = json.loads(cluster.podman("inspect", cluster.container(service)).stdout)
        assert state["Config"]["Env"] and any(e == "FARM_STORAGE_URL=s3://farm/jobs" for e in state["Config"]["Env"])
        destinations = {m["Destination"] for m in state["Mounts"]}
        assert "/storage" not in destinations, f"{service} mounts /storage: {state['Mounts']}"


def test_the_services_commands_work_from_any_working_folder(cluster: Cluster) -> None:
    """The image's own working folder and others: the installed package is what every command imports."""
    for folder in ("/home/farm", "/", "/tmp"):
        done = cluster.podman(
            "run", "--rm", "--network", "none", "-w", folder, "--entrypoint", "python", "mediafarm:cpu", "-c",
            "import mediafarm.tasks.app, mediafarm.workers.app, mediafarm.gateway.app, mediafarm.tasks, sys;"
            "print(mediafarm.tasks.__file__)", check=False,
        )  # fmt: skip
        assert done.returncode == 0 and "site-packages" in done.stdout, f"from {folder}: {done.stderr[-2000:]}"


def test_the_worker_log_names_its_pool_and_queues(cluster: Cluster) -> None:
    log = cluster.logs("worker-cpu")
    # The pool's queues as the image declares them (this session adds test families of its own).
    expected = json.loads(cluster.podman(
        "exec", cluster.container("worker-cpu"), "python", "-c",
        "import json; from mediafarm.config.pools import expand_queues, get_pool; from mediafarm.tasks import registry;"
        "print(json.dumps(expand_queues(get_pool('cpu').queues, registry.default_queues())))",
    ).stdout)  # fmt: skip
    assert "vad" in expected and "subtitle" in expected, expected
    assert "cpu@" in log, log[-3000:]
    for queue in expected:
        banner = f".> {queue} " in log or f".> {queue}\n" in log
        assert banner, f"queue {queue!r} not in the worker's banner:\n{log[-3000:]}"


def test_flowers_api_lists_the_worker(cluster: Cluster) -> None:
    deadline = time.monotonic() + 60
    while True:
        workers = httpx.get(cluster.urls["flower"] + "/api/workers", params={"refresh": "true"}, timeout=30)
        assert workers.status_code == 200, workers.text
        names = list(workers.json())
        if any(n.startswith("cpu@") for n in names) or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert any(n.startswith("cpu@") for n in names), names
    worker = workers.json()[next(n for n in names if n.startswith("cpu@"))]
    consumed = {q["name"] for q in worker.get("active_queues", [])}
    assert "vad" in consumed and "subtitle" in consumed, worker.get("active_queues")
