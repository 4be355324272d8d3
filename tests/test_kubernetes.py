"""deploy/k8s: no cluster runs here, so the manifests are checked, not applied.

Against the Kubernetes OpenAPI schemas, which the `kubernetes-validate` wheel carries (nothing is
fetched), strictly, so that a misspelt field fails; `kubectl kustomize` builds the folder where
kubectl is installed. Then what the farm needs of them: every FARM_* variable is a setting and
parses, each worker's grace period covers its drain, each Deployment runs what its Compose service
runs, a worker's memory holds its pool's capped children, the GPU pool asks for its GPUs, the probes
ask what answers, each worker's preStop drains its own node, and every name one manifest gives
another (Services, claims, settings) exists. The KEDA component's ScaledObjects are checked against
the ScaledObject CRD's own schema kept in deploy/k8s/keda (with `jsonschema`, as strictly), and each
must scale a worker Deployment of the folder on its own pool's load, a series the farm serves.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mediafarm.config.pools import DEFAULT_POOLS
from mediafarm.config.settings import FarmSettings
from tests.conftest import REPO

KUBE = REPO / "deploy" / "k8s"
KUSTOMIZATION = KUBE / "kustomization.yaml"
# The KEDA component, off by default (keda/kustomization.yaml says why), and the schema of KEDA's
# ScaledObject CRD kept beside it (its $comment names the source and version).
KEDA = KUBE / "keda"
KEDA_SCHEMA = KEDA / "scaledobject.schema.json"
COMPOSE = REPO / "docker-compose.yml"
# In the folder but left out of the kustomization on purpose: the Secret's example, which applied
# at every `kubectl apply -k` would overwrite the operator's real Secret with placeholders.
EXAMPLE_SUFFIX = ".example.yaml"
# An older Kubernetes, so that no manifest needs a field newer than it, and the newest the wheel carries.
OLDER_KUBERNETES = "1.30"
# What a worker's grace period must leave after FARM_DRAIN_SECONDS for the handback and the exit,
# and the cluster autoscaler's limit on it (docs/operating.md, Draining a worker).
HANDBACK_AND_EXIT_S = 30
AUTOSCALER_LIMIT_S = 600
_QUANTITY = re.compile(r"(\d+(?:\.\d+)?)([KMGTP]i|[kMGTP])?")
_UNIT = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
         **{f"{p}i": 1024 ** (n + 1) for n, p in enumerate("KMGTP")}}  # fmt: skip


def manifest_files() -> list[Path]:
    return sorted(p for p in KUBE.glob("*.yaml") if p != KUSTOMIZATION)


def load(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.fixture(scope="module")
def resources() -> list[dict]:
    return [doc for path in manifest_files() for doc in load(path)]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def named(resources: list[dict], kind: str) -> dict[str, dict]:
    return {r["metadata"]["name"]: r for r in resources if r["kind"] == kind}


def workloads(resources: list[dict]) -> Iterator[dict]:
    yield from (r for r in resources if r["kind"] in ("Deployment", "StatefulSet"))


def farm_containers(resources: list[dict]) -> Iterator[tuple[dict, dict]]:
    """(workload, container) for every container running the farm's image."""
    for w in workloads(resources):
        for c in w["spec"]["template"]["spec"]["containers"]:
            if c["image"].split(":")[0] == "mediafarm":
                yield w, c


def workers(resources: list[dict]) -> Iterator[tuple[dict, dict, str]]:
    """(workload, container, pool) for every worker: the image's `farm` run as `worker --pool P`."""
    for w, c in farm_containers(resources):
        args = c.get("args", [])
        if "command" not in c and args[:1] == ["worker"]:
            yield w, c, args[args.index("--pool") + 1]


def literal_env(container: dict, resources: list[dict]) -> dict[str, str]:
    """The variables a container sees with their values, as Kubernetes resolves them (envFrom, then
    env); those from a Secret are the operator's and left out."""
    configmaps = named(resources, "ConfigMap")
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(configmaps[source["configMapRef"]["name"]]["data"])
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
    return env


def pod_settings(container: dict, resources: list[dict], monkeypatch: pytest.MonkeyPatch) -> FarmSettings:
    """The settings the container's farm process reads: its environment alone (`--pool` sets FARM_POOL)."""
    for name in [n for n in os.environ if n.startswith("FARM_")]:
        monkeypatch.delenv(name)
    env = literal_env(container, resources)
    args = container.get("args", [])
    if "--pool" in args:
        env["FARM_POOL"] = args[args.index("--pool") + 1]
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return FarmSettings()


def quantity(value: Any) -> float:
    match = _QUANTITY.fullmatch(str(value))
    assert match, f"not a Kubernetes quantity: {value!r}"
    return float(match[1]) * _UNIT[match[2]]


def compose_bytes(value: str) -> int:
    """Compose's mem_limit, whose units (b, k, m, g) are powers of 1024."""
    number, unit = re.fullmatch(r"(\d+)([bkmg]?)", value.lower()).groups()  # type: ignore[union-attr]
    return int(number) * {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30}[unit]


def scaled_object_files() -> list[Path]:
    return sorted(KEDA.glob("*.scaledobject.yaml"))


@pytest.fixture(scope="module")
def scaled_objects() -> list[dict]:
    return [doc for path in scaled_object_files() for doc in load(path)]


def strict(schema: Any) -> Any:
    """The CRD's schema as the API server applies it under strict field validation (kubectl's
    default): a field no object declares is an error, not pruned. Objects that declare no fields
    (`metadata`) or a map of values (`additionalProperties`) stay open."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {k: strict(v) for k, v in schema.items()}
    if "properties" in schema and "additionalProperties" not in schema:
        closed["additionalProperties"] = False
    return closed


def test_every_manifest_validates_against_the_kubernetes_schemas(resources: list[dict]) -> None:
    kv = pytest.importorskip("kubernetes_validate.utils", reason="kubernetes-validate (the dev extra) not installed")

    def problems(resource: dict, version: str) -> list[str]:
        try:
            kv.validate(resource, version, strict=True)
        except kv.ValidationError as exc:
            return [f"{resource['kind']}/{resource['metadata']['name']} {'.'.join(map(str, exc.path))}: {exc.message}"]
        except kv.SchemaNotFoundError as exc:  # the command line only warns of a kind it has no schema for
            return [exc.message]
        return []

    assert {r["kind"] for r in resources} >= {"Deployment", "StatefulSet", "Service", "ConfigMap", "Secret"}
    for version in (OLDER_KUBERNETES, kv.latest_version()):
        assert [p for r in resources for p in problems(r, version)] == [], version
    worker, _, _ = next(workers(resources))
    misspelt = {**worker, "spec": {**worker["spec"], "replica": 2}}
    assert problems(misspelt, kv.latest_version()), "the strict check accepts an unknown field"


def test_the_kustomization_lists_every_manifest_and_sets_the_namespace_they_leave_out(resources: list[dict]) -> None:
    kustomization = yaml.safe_load(KUSTOMIZATION.read_text())
    listed = kustomization["resources"]
    expected = [p.name for p in manifest_files() if not p.name.endswith(EXAMPLE_SUFFIX)]
    assert sorted(listed) == sorted(expected) and len(set(listed)) == len(listed)
    assert kustomization["namespace"]
    assert [r["metadata"]["name"] for r in resources if "namespace" in r["metadata"]] == []


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (its built-in kustomize) is not installed")
def test_kustomize_builds_the_folder_into_one_namespace() -> None:
    built = subprocess.run(["kubectl", "kustomize", str(KUBE)], capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    docs = [d for d in yaml.safe_load_all(built.stdout) if d]
    listed = yaml.safe_load(KUSTOMIZATION.read_text())["resources"]
    assert len(docs) == sum(len(load(KUBE / name)) for name in listed)
    namespace = yaml.safe_load(KUSTOMIZATION.read_text())["namespace"]
    assert {d["metadata"]["namespace"] for d in docs} == {namespace}


def test_every_farm_variable_is_a_setting_and_each_pod_s_values_parse(
    resources: list[dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = FarmSettings.model_config["env_prefix"]
    settings = {prefix + name.upper() for name in FarmSettings.model_fields}
    assert "FARM_DRAIN_SECONDS" in settings and "FARM_API_TOKENS" in settings
    given = {n for r in named(resources, "ConfigMap").values() for n in r["data"]}
    given |= {n for r in named(resources, "Secret").values() for n in r.get("stringData", {})}
    for _, c in farm_containers(resources):
        given |= {v["name"] for v in c.get("env", [])}
        given |= {v["valueFrom"]["secretKeyRef"]["key"] for v in c.get("env", []) if "valueFrom" in v}
    farm = {n for n in given if n.startswith(prefix)}
    assert farm and farm - settings == set()
    for _, c in farm_containers(resources):
        pod_settings(c, resources, monkeypatch)  # a value that does not parse raises here
        assert "FARM_CONFIG_FILE" not in literal_env(c, resources), "the pool checks below read the default pools"


def test_each_worker_s_grace_period_covers_its_drain(resources: list[dict], monkeypatch: pytest.MonkeyPatch) -> None:
    found = list(workers(resources))
    assert found, "no worker Deployment"
    for w, c, _ in found:
        settings = pod_settings(c, resources, monkeypatch)
        grace = w["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
        name = w["metadata"]["name"]
        assert settings.drain_on_sigterm, f"{name}: the kubelet's SIGTERM would not drain"
        assert settings.drain_seconds + HANDBACK_AND_EXIT_S <= grace <= AUTOSCALER_LIMIT_S, (
            f"{name}: grace {grace} s, FARM_DRAIN_SECONDS {settings.drain_seconds}"
        )


def test_each_deployment_runs_what_its_compose_service_runs(resources: list[dict], compose: dict) -> None:
    services = compose["services"]
    deployments = named(resources, "Deployment")
    compose_workers = {n for n in services if n.startswith("worker-")}
    assert compose_workers <= set(deployments), "a Compose pool without its Deployment"
    for name, d in deployments.items():
        svc = services[name]
        (c,) = d["spec"]["template"]["spec"]["containers"]
        assert c["image"] == svc["image"], name
        # Compose's `command` is the image's CMD (Kubernetes' args), its `entrypoint` the ENTRYPOINT.
        assert c.get("args") == svc.get("command") and c.get("command") == svc.get("entrypoint"), name
    # The Compose cluster keeps its files in its own objects service; the manifests keep the shared
    # claim until an operator names a store of theirs (docs/operating.md, Kubernetes).
    own_store = {"FARM_STORAGE_URL", "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                 "AWS_DEFAULT_REGION"}  # fmt: skip
    farm_env = {k: str(v) for k, v in compose["x-farm-env"].items() if k not in own_store}
    assert own_store <= set(compose["x-farm-env"])
    assert named(resources, "ConfigMap")["farm-settings"]["data"] == farm_env
    for w, c, _ in workers(resources):
        env = literal_env(c, resources)
        assert env["FARM_METRICS_PORT"] == services[w["metadata"]["name"]]["environment"]["FARM_METRICS_PORT"]


def test_a_worker_s_memory_holds_its_pool_s_children_and_the_gpu_pool_asks_for_its_gpus(
    resources: list[dict], compose: dict
) -> None:
    gpus_asked = 0
    for w, c, pool_name in workers(resources):
        name, pool = w["metadata"]["name"], DEFAULT_POOLS[pool_name]
        limits, requests = c["resources"]["limits"], c["resources"]["requests"]
        children = pool.concurrency * (pool.child_rss_cap_mb or 0) * 2**20
        # Above the caps, so the watchdog, not the kernel's OOM killer, stops a hungry child.
        assert quantity(limits["memory"]) > children, f"{name}: limit {limits['memory']}, children {children} B"
        # Equal: a node short of memory evicts pods above their requests first, without the drain.
        assert quantity(requests["memory"]) == quantity(limits["memory"]), name
        assert quantity(limits["memory"]) == compose_bytes(compose["services"][name]["mem_limit"]), name
        assert int(limits.get("nvidia.com/gpu", 0)) == len(pool.gpus), f"{name}: pool {pool_name} uses {pool.gpus}"
        gpus_asked += int(limits.get("nvidia.com/gpu", 0))
    assert gpus_asked, "no GPU worker Deployment"


def test_a_worker_is_ready_on_its_own_ping_and_alive_on_its_metrics_port(resources: list[dict]) -> None:
    for w, c, pool in workers(resources):
        name = w["metadata"]["name"]
        ping = " ".join(c["readinessProbe"]["exec"]["command"])
        assert "inspect ping" in ping and f" -d {pool}@$(" in ping, f"{name}: not its own node's ping: {ping}"
        (metrics,) = [p for p in c["ports"] if p["name"] == "metrics"]
        assert str(metrics["containerPort"]) == literal_env(c, resources)["FARM_METRICS_PORT"], name
        for probe in ("startupProbe", "livenessProbe"):  # not the ping: a Redis outage must restart nothing
            assert c[probe]["tcpSocket"]["port"] == "metrics", f"{name}: {probe}"


def test_the_gateway_s_readiness_route_answers_a_pod_without_a_token(resources: list[dict]) -> None:
    import httpx

    from mediafarm.gateway.app import create_app
    from tests.gateway.conftest import gateway_config

    (c,) = named(resources, "Deployment")["gateway"]["spec"]["template"]["spec"]["containers"]
    probe = c["readinessProbe"]["httpGet"]
    (port,) = [p for p in c["ports"] if p["name"] == probe["port"]]
    assert str(port["containerPort"]) == c["args"][c["args"].index("--port") + 1]

    async def ask() -> httpx.Response:  # the kubelet calls from the node's address, with no token
        transport = httpx.ASGITransport(app=create_app(gateway_config()), client=("10.1.2.3", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
            return await http.get(probe["path"])

    answer = asyncio.run(ask())
    assert answer.status_code == 200, (probe["path"], answer.status_code, answer.text)


def test_every_name_a_manifest_gives_another_exists(resources: list[dict]) -> None:
    configmaps, secrets = named(resources, "ConfigMap"), named(resources, "Secret")
    claims = set(named(resources, "PersistentVolumeClaim"))
    for w in workloads(resources):
        spec, name = w["spec"]["template"]["spec"], w["metadata"]["name"]
        assert w["spec"]["selector"]["matchLabels"].items() <= w["spec"]["template"]["metadata"]["labels"].items()
        for volume in spec.get("volumes", []):
            assert volume["persistentVolumeClaim"]["claimName"] in claims, f"{name}: {volume}"
        for c in spec["containers"]:
            assert {m["name"] for m in c.get("volumeMounts", [])} <= {v["name"] for v in spec.get("volumes", [])} | {
                t["metadata"]["name"] for t in w["spec"].get("volumeClaimTemplates", [])
            }, name
            for source in c.get("envFrom", []):
                assert source["configMapRef"]["name"] in configmaps, name
            for var in c.get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secrets[ref["name"]]["stringData"], f"{name}: {ref}"
    pods = [w["spec"]["template"] for w in workloads(resources)]
    for service in named(resources, "Service").values():
        selected = [p for p in pods if service["spec"]["selector"].items() <= p["metadata"]["labels"].items()]
        assert len(selected) == 1, f"service {service['metadata']['name']} selects {len(selected)} pod templates"
        ports = {p["name"] for c in selected[0]["spec"]["containers"] for p in c.get("ports", [])}
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= ports, service["metadata"]["name"]
    settings = configmaps["farm-settings"]["data"]
    for url in (settings["FARM_BROKER_URL"], settings["FARM_RESULT_BACKEND"]):
        assert url.split("://")[1].split(":")[0] in named(resources, "Service"), f"{url}: no Service of that name"


def test_every_scaled_object_validates_against_keda_s_own_crd_schema(scaled_objects: list[dict]) -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (the dev extra) not installed")
    schema = json.loads(KEDA_SCHEMA.read_text())
    assert "kedacore/keda" in schema["$comment"] and "v2." in schema["$comment"], "the schema names its source"
    validator = jsonschema.Draft7Validator(strict(schema))

    def problems(resource: dict) -> list[str]:
        return [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(resource)]

    assert len(scaled_objects) == len(scaled_object_files()) >= 2
    for scaled in scaled_objects:
        assert (scaled["apiVersion"], scaled["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
        assert problems(scaled) == [], scaled["metadata"]["name"]
    scaled = scaled_objects[0]
    misspelt = {**scaled, "spec": {**scaled["spec"], "minReplicaCout": 1}}
    assert problems(misspelt), "the schema accepts an unknown field"
    (trigger, *_) = scaled["spec"]["triggers"]
    deep = {**scaled, "spec": {**scaled["spec"], "triggers": [{**trigger, "metricTpye": "Value"}]}}
    assert problems(deep), "the schema accepts an unknown field in a trigger"
    wrong_type = {**scaled, "spec": {**scaled["spec"], "maxReplicaCount": "4"}}
    assert problems(wrong_type), "the schema accepts a string count"


def test_the_keda_component_lists_every_scaled_object_and_nothing_else_names_keda_s_kind(
    resources: list[dict],
) -> None:
    component = yaml.safe_load((KEDA / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"
    assert sorted(component["resources"]) == [p.name for p in scaled_object_files()]
    # The default resources apply on a cluster without KEDA: none is of a KEDA kind.
    assert [r["kind"] for r in resources if r["apiVersion"].startswith("keda.sh/")] == []
    assert "components" not in yaml.safe_load(KUSTOMIZATION.read_text())


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (its built-in kustomize) is not installed")
def test_kustomize_builds_the_folder_with_keda_on_as_its_kustomization_says(tmp_path: Path) -> None:
    # As an operator turns it on: the commented `components:` lines of the kustomization uncommented.
    folder = tmp_path / "k8s"
    shutil.copytree(KUBE, folder)
    text = KUSTOMIZATION.read_text()
    enabled = re.sub(r"^# (components:\n)#(   - keda\n)", r"\1\2", text, flags=re.M)
    assert enabled != text, "the kustomization shows no commented `components: [keda]` to uncomment"
    (folder / "kustomization.yaml").write_text(enabled)
    built = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    docs = [d for d in yaml.safe_load_all(built.stdout) if d]
    listed = yaml.safe_load(text)["resources"]
    assert len(docs) == sum(len(load(KUBE / name)) for name in listed) + len(scaled_object_files())
    assert {d["metadata"]["namespace"] for d in docs} == {yaml.safe_load(text)["namespace"]}
    scaled = {d["spec"]["scaleTargetRef"]["name"] for d in docs if d["kind"] == "ScaledObject"}
    # KEDA's HPA owns their replicas: a count applied would set a pool back under its running jobs.
    assert scaled and [d["metadata"]["name"] for d in docs if d["metadata"]["name"] in scaled
                       and d["kind"] == "Deployment" and "replicas" in d["spec"]] == []  # fmt: skip
    # The pools it scales from zero are the farm's wake pools, in the ConfigMap every process reads.
    assert settings_of(docs)["FARM_WAKE_POOLS"] == keda_settings()["FARM_WAKE_POOLS"] == "gpu0"


def test_each_worker_pool_has_a_scaled_object_on_its_own_load_a_series_the_farm_serves(
    resources: list[dict], scaled_objects: list[dict]
) -> None:
    from tests.test_compose import exported_series

    pools = {w["metadata"]["name"]: p for w, _c, p in workers(resources)}
    targets = [s["spec"]["scaleTargetRef"] for s in scaled_objects]
    assert sorted(t["name"] for t in targets) == sorted(pools), "not one ScaledObject per worker Deployment"
    for scaled, target in zip(scaled_objects, targets, strict=True):
        name, spec = scaled["metadata"]["name"], scaled["spec"]
        assert target.get("kind", "Deployment") == "Deployment" and target.get("apiVersion", "apps/v1") == "apps/v1"
        pool = pools[target["name"]]
        queries = [t["metadata"]["query"] for t in spec["triggers"] if t["type"] == "prometheus"]
        assert queries and len(queries) == len(spec["triggers"]), f"{name}: every trigger is the Prometheus scaler"
        asked = {series for q in queries for series in re.findall(r"\bmediafarm_[a-z0-9_]+", q)}
        assert asked == {"mediafarm_pool_load"} and asked <= exported_series(), name
        assert {label for q in queries for label in re.findall(r'pool="([^"]+)"', q)} == {pool}, name
        assert 0 <= spec["minReplicaCount"] <= spec["maxReplicaCount"], name
        if spec["minReplicaCount"] == 0:
            # Woken by the jobs that want it (tasks/producer/wake.py): it is a wake pool, any load activates
            # it, and its idle time outlasts the wake window, or the jobs that woke it would wake it
            # again as it goes.
            assert pool in keda_settings().get("FARM_WAKE_POOLS", "").split(","), name
            assert [t["metadata"].get("activationThreshold") for t in spec["triggers"]] == ["0"], name
            window = {**settings_of(resources), **keda_settings()}.get(
                "FARM_WAKE_WINDOW", FarmSettings.model_fields["wake_window"].default)  # fmt: skip
            assert spec.get("cooldownPeriod", 300) > float(window), name
    # Some pool always runs: the one that takes every family's last rung, the jobs' fallback.
    assert any(s["spec"]["minReplicaCount"] >= 1 for s in scaled_objects)


def settings_of(resources: list[dict]) -> dict[str, str]:
    """The FARM_* settings the folder's ConfigMaps give."""
    return {k: v for d in resources if d["kind"] == "ConfigMap" for k, v in (d.get("data") or {}).items()}


def keda_settings() -> dict[str, str]:
    """The settings the KEDA component adds to the farm's ConfigMap (its JSON patches)."""
    out = {}
    for patch in yaml.safe_load((KEDA / "kustomization.yaml").read_text()).get("patches", []):
        if patch["target"]["kind"] == "ConfigMap":
            out.update({op["path"].removeprefix("/data/"): op["value"] for op in yaml.safe_load(patch["patch"])
                        if op["op"] == "add" and op["path"].startswith("/data/")})  # fmt: skip
    return out


def test_the_operating_page_points_at_the_scaled_objects_instead_of_copying_one() -> None:
    from tests.support.docs import code_blocks

    page = REPO / "docs" / "operating.md"
    assert [b for b in code_blocks(page) if "kind: ScaledObject" in b.text] == []
    text = page.read_text()
    for path in [KEDA / "kustomization.yaml", *scaled_object_files()]:
        assert str(path.relative_to(REPO)) in text, f"docs/operating.md does not name {path.relative_to(REPO)}"


def test_each_worker_s_pre_stop_drains_its_own_node_and_waits(resources: list[dict]) -> None:
    for w, c, pool in workers(resources):
        name = w["metadata"]["name"]
        hook = " ".join(c["lifecycle"]["preStop"]["exec"]["command"])
        ping = " ".join(c["readinessProbe"]["exec"]["command"])
        node = re.search(r"-d (\S+@\$\(.*?'\))", ping)
        assert node and node[1].startswith(f"{pool}@"), f"{name}: {ping}"
        # The node the readiness probe pings is the one the hook drains; --wait holds the SIGTERM
        # back until the worker has stopped. The hook's time counts in the grace period, which
        # test_each_worker_s_grace_period_covers_its_drain checks covers the drain.
        assert f"farm drain {node[1]} --wait" in hook, f"{name}: {hook}"
