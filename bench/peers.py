"""Farm jobs against the bare libraries a user would call instead, side by side.

Run from the repository root::

    .venv/bin/python -m bench.peers --family vad --seconds 120 --pairs 3

Every family here has one *farm* contender (its job through a real worker: an embedded Redis, a
prefork worker with one child, ``submit(...).wait()``) and its *peers* (the bare library calls a
user would make instead, run in this process). Rules, the same for every family:

* Same inputs, generated here (``--workdir``, kept and reused), general enough to show
  differences: several voices, noise, long gaps, short utterances for the speech families.
* Same threads: one on both sides (``OMP_NUM_THREADS=1`` and friends for this process and the
  worker, torch's and every ONNX session's intra- and inter-op threads 1).
* Model load excluded on both sides: every contender runs once on the first input before any
  timing (the farm's warm-up job loads the model in its one pool child, which keeps it).
* Alternating pairs: for each input, each round, each peer runs right beside the farm contender,
  the order flipping from pair to pair, so drift on a shared machine hits both alike; the ratio
  peer seconds / farm seconds is taken within the pair. Reported: every figure, the median of
  each side and the median of the ratios, per input and over all inputs.
* Wall time is what is compared; CPU time is reported beside it (the worker and its pool child
  for the farm's job, from psutil; this process for the peers), as this machine's other load
  stretches wall times more than CPU times. Redis's own CPU is not counted.
* The outputs are compared as well as the times (for VAD: the number of spans and the largest
  boundary difference; for YOLO the frames the model saw and the detection intervals; for TTS
  the audio's samples), so a faster contender that answers something else shows.

A family adds itself to ``FAMILIES`` (a name -> :class:`FamilyBench` factory); ``--family all``
runs every one. Results go to ``bench/results/peers.json``.

vad
    Inputs: ``tests.support.vad_tracks`` (speech with 8-30 s silences, speech in noise with noise
    bursts, music-like chords and note runs with speech between, single short words 0.2-1.5 s
    apart), ``--seconds`` each. Farm: a ``vad`` job on the default ladder (the ``silero-onnx`` rung:
    threshold 0.5, min_silence_ms 300, speech_pad_ms 30). Peers, all with those parameters and
    ``min_speech_duration_ms=0`` (the rung keeps short spans), each reading the WAV with soundfile
    inside its timed call (the farm's job decodes it too): silero-vad's ``get_speech_timestamps``
    with the ONNX model (``onnx=True``) and with the default TorchScript model, its ``VADIterator``
    over 512-sample windows (its streaming example), and its own batched
    ``get_speech_timestamps_sequence``. Also the farm's engine called in this process
    (``EngineContext.local()``), paired with the job, which shows what the job adds around it.

yolo
    ``bench/peers_yolo.py``: a ``yolo`` job (the ``yolo-nano`` rung, the tests' random-weight
    YOLO11n) against ultralytics' ``predict`` on every frame and with ``vid_stride`` (the rung's
    stride), on generated videos (short moves, constant motion, noise, a 720p camera-like GOP).

subtitle, subtitle-heldout
    ``bench/peers_subtitle.py``: a ``subtitle`` job against faster-whisper's ``transcribe`` and
    ``BatchedInferencePipeline``, on the project's own tracks; ``bench/peers_heldout.py``: the
    same on the held-out half of a corpus no setting was chosen on (``--seconds`` unused there).

tts-piper, tts-espeak
    ``bench/peers_tts.py``: a ``tts`` job on the ``piper`` rung against piper-tts's
    ``PiperVoice.synthesize_wav``, and on the ``espeak`` rung against the ``espeak-ng`` command,
    on texts of one sentence, three, and about ``--seconds`` of speech; audio compared by samples.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

from bench.farm import REPO, farm, worker
from bench.peers_heldout import heldout_bench
from bench.peers_subtitle import subtitle_bench
from bench.peers_tts import espeak_bench, piper_bench
from bench.peers_yolo import yolo_bench

RESULTS = REPO / "bench" / "results" / "peers.json"
ONE_THREAD = {v: "1" for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")}


@dataclass
class Contender:
    """One way of doing the job: ``run(input)`` returns its output, which ``compare`` reads.
    ``cpu()`` is the CPU seconds so far of the processes doing the work (None: unknown now);
    by default this process's (all its threads)."""

    name: str
    run: Callable[[Any], Any]
    cpu: Callable[[], float | None] = field(default=lambda: own_cpu())


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def process_tree_cpu(pid: int) -> Callable[[], float | None]:
    """CPU seconds of process ``pid`` and its children (a worker and its pool), None when a child
    came or went since the last reading (a recycled child takes its seconds with it)."""
    import psutil

    seen: set[int] = set()

    def cpu() -> float | None:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
        pids = {p.pid for p in procs}
        changed = seen and pids != seen
        seen.clear()
        seen.update(pids)
        total = sum(sum(p.cpu_times()[:2]) for p in procs)
        return None if changed else total

    return cpu


@dataclass
class FamilyBench:
    """What a family brings: its inputs, the farm contender, its peers and how outputs compare.

    ``farm`` is entered as a context manager around the runs (it starts and stops a worker).
    ``compare(farm_output, peer_output)`` returns figures of agreement (JSON-safe).
    """

    name: str
    inputs: list[Any]
    farm: Callable[[], contextlib.AbstractContextManager[Contender]]
    peers: list[Contender]
    compare: Callable[[Any, Any], dict[str, Any]]
    describe: Callable[[Any], str] = str
    meta: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------- the farm side: a real worker
@contextlib.contextmanager
def farm_worker(workdir: Path, queue: str) -> Iterator[int]:
    """One prefork worker with one child on ``queue``, stopped on the way out. Yields its pid."""
    node = f"peers-{os.getpid()}@{os.uname().nodename}"
    with worker("cpu", workdir, node=node, log=f"worker-{queue}.log", concurrency=1, queues=[queue]) as process:
        yield process.pid


# ---------------------------------------------------------------- vad
def vad_bench(args: argparse.Namespace, workdir: Path) -> FamilyBench:
    import numpy as np
    import soundfile as sf
    import torch
    from silero_vad import VADIterator, get_speech_timestamps, get_speech_timestamps_sequence, load_silero_vad

    from mediafarm.tasks.families.vad import engines
    from mediafarm.tasks.families.vad.spec import FAMILY, SileroParams, VadRequest
    from mediafarm.tasks.runtime.context import EngineContext
    from tests.support.vad_tracks import KINDS, make

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    rung = FAMILY.ladder[0]
    params = SileroParams(**rung.params)
    rate = engines.SAMPLE_RATE
    common = {
        "threshold": params.threshold, "sampling_rate": rate, "min_silence_duration_ms": params.min_silence_ms,
        "speech_pad_ms": params.speech_pad_ms, "min_speech_duration_ms": 0,
    }  # fmt: skip

    inputs = []
    for kind in KINDS:
        path = workdir / f"vad-{kind}-{args.seconds:g}s-seed{args.seed}.wav"
        if not path.exists():
            partial = path.with_suffix(".partial.wav")
            make(kind, partial, args.seconds, seed=args.seed)
            partial.rename(path)
        inputs.append(path)

    onnx_model, jit_model = load_silero_vad(onnx=True), load_silero_vad()
    sequence_model = load_silero_vad(sequence=True)

    def read(path: Path) -> np.ndarray:
        audio, sr = sf.read(str(path), dtype="float32")
        assert sr == rate and audio.ndim == 1, (path, sr, audio.shape)
        return audio

    def seconds(found: list[dict[str, int]]) -> list[tuple[float, float]]:
        return [(s["start"] / rate, s["end"] / rate) for s in found]

    def timestamps(model: Any) -> Callable[[Path], list[tuple[float, float]]]:
        return lambda path: seconds(get_speech_timestamps(torch.from_numpy(read(path)), model, **common))

    def sequence(path: Path) -> list[tuple[float, float]]:
        return seconds(get_speech_timestamps_sequence(read(path), sequence_model, **common))

    def iterator(path: Path) -> list[tuple[float, float]]:
        audio = read(path)
        vad = VADIterator(
            onnx_model,
            threshold=params.threshold,
            sampling_rate=rate,
            min_silence_duration_ms=params.min_silence_ms,
            speech_pad_ms=params.speech_pad_ms,
        )
        n, spans, start = engines.SILERO_WINDOW, [], None
        wav = torch.from_numpy(np.pad(audio, (0, -audio.size % n)))
        for i in range(0, wav.numel(), n):
            event = vad(wav[i : i + n])
            if event and "start" in event:
                start = event["start"]
            if event and "end" in event:
                spans.append((start / rate, event["end"] / rate))
                start = None
        vad.reset_states()
        if start is not None:
            spans.append((start / rate, audio.size / rate))
        return spans

    def engine(path: Path) -> list[tuple[float, float]]:
        result = engines.silero(EngineContext.local(), VadRequest(media=str(path)), params)
        return [(s.start, s.end) for s in result.spans]

    @contextlib.contextmanager
    def job() -> Iterator[Contender]:
        with farm_worker(workdir, "vad") as worker:
            from mediafarm.tasks.producer.client import submit

            def run(path: Path) -> list[tuple[float, float]]:
                envelope = submit("vad", media=str(path)).wait(timeout=600)
                assert envelope["rung"] == rung.name, envelope["rung"]
                return [(s["start"], s["end"]) for s in envelope["output"]["spans"]]

            yield Contender("farm vad job", run, cpu=process_tree_cpu(worker))

    def compare(ours: list[tuple[float, float]], theirs: list[tuple[float, float]]) -> dict[str, Any]:
        same_count = len(ours) == len(theirs)
        worst = max((abs(a - b) for o, t in zip(ours, theirs) for a, b in zip(o, t)), default=0.0)
        return {"spans": len(ours), "peer_spans": len(theirs), "same_count": same_count,
                "max_boundary_ms": round(worst * 1000, 1) if same_count else None}  # fmt: skip

    return FamilyBench(
        name="vad",
        inputs=inputs,
        farm=job,
        peers=[
            Contender("silero get_speech_timestamps onnx", timestamps(onnx_model)),
            Contender("silero get_speech_timestamps torch", timestamps(jit_model)),
            Contender("silero VADIterator onnx", iterator),
            Contender("silero get_speech_timestamps_sequence", sequence),
            Contender("farm engine in-process", engine),
        ],
        compare=compare,
        describe=lambda p: f"{p.name} ({sf.info(str(p)).duration:.1f} s)",
        meta={
            "rung": rung.name, "params": dict(rung.params), "silero-vad": version("silero-vad"),
            "onnxruntime": version("onnxruntime"), "torch": version("torch"), "seconds": args.seconds,
        },  # fmt: skip
    )


FAMILIES: dict[str, Callable[[argparse.Namespace, Path], FamilyBench]] = {
    "vad": vad_bench, "yolo": yolo_bench, "tts-piper": piper_bench, "tts-espeak": espeak_bench,
    "subtitle": subtitle_bench, "subtitle-heldout": heldout_bench,
}


# ---------------------------------------------------------------- the runner, the same for every family
def timed(contender: Contender, item: Any) -> tuple[float, float | None, Any]:
    """Wall seconds, CPU seconds (None when unknown) and output of one run."""
    c0, t0 = contender.cpu(), time.perf_counter()
    out = contender.run(item)
    t1, c1 = time.perf_counter(), contender.cpu()
    return t1 - t0, (c1 - c0 if c0 is not None and c1 is not None else None), out


def run_family(bench: FamilyBench, pairs: int) -> dict[str, Any]:
    cells: dict[str, dict[str, Any]] = {}
    with bench.farm() as farm:
        for contender in (farm, *bench.peers):  # warm-up: model loads and first-call costs, not timed
            contender.cpu()
            contender.run(bench.inputs[0])
        for item in bench.inputs:
            label = bench.describe(item)
            for peer in bench.peers:
                series = {k: [] for k in ("farm_s", "peer_s", "ratio", "farm_cpu_s", "peer_cpu_s", "cpu_ratio")}
                cell = cells.setdefault(f"{label} | {peer.name}", {"input": label, "peer": peer.name, **series})
                for r in range(pairs):
                    first_farm = (r + bench.peers.index(peer)) % 2 == 0
                    order = (farm, peer) if first_farm else (peer, farm)
                    runs = [timed(c, item) for c in order]
                    (farm_s, farm_cpu, farm_out), (peer_s, peer_cpu, peer_out) = runs if first_farm else runs[::-1]
                    cell["farm_s"].append(farm_s)
                    cell["peer_s"].append(peer_s)
                    cell["ratio"].append(peer_s / farm_s)
                    if farm_cpu and peer_cpu:
                        cell["farm_cpu_s"].append(farm_cpu)
                        cell["peer_cpu_s"].append(peer_cpu)
                        cell["cpu_ratio"].append(peer_cpu / farm_cpu)
                    cell["agreement"] = bench.compare(farm_out, peer_out)
                    cpu = f", CPU {farm_cpu:.3f} / {peer_cpu:.3f} s" if farm_cpu and peer_cpu else ""
                    print(f"{label} | {peer.name} pair {r + 1}/{pairs}: farm {farm_s:.3f} s, peer {peer_s:.3f} s{cpu}, "
                          f"peer/farm {peer_s / farm_s:.2f}, {cell['agreement']}", flush=True)  # fmt: skip
    for cell in cells.values():
        for key in ("farm_s", "peer_s", "ratio", "farm_cpu_s", "peer_cpu_s", "cpu_ratio"):
            cell[f"median_{key}"] = statistics.median(cell[key]) if cell[key] else None
    overall = {}
    for peer in bench.peers:
        mine = [c for c in cells.values() if c["peer"] == peer.name]
        ratios = [r for c in mine for r in c["ratio"]]
        cpu_ratios = [r for c in mine for r in c["cpu_ratio"]]
        overall[peer.name] = {
            "median_ratio": statistics.median(ratios),
            "min_ratio": min(ratios),
            "max_ratio": max(ratios),
            "pairs": len(ratios),
            "median_cpu_ratio": statistics.median(cpu_ratios) if cpu_ratios else None,
            "cpu_pairs": len(cpu_ratios),
            "all_same_count": all(c["agreement"].get("same_count", True) for c in mine),
            # None for a family whose comparison has no boundaries (TTS compares samples).
            "max_boundary_ms": max((c["agreement"].get("max_boundary_ms") or 0.0 for c in mine
                                    if "max_boundary_ms" in c["agreement"]), default=None),
        }
    return {"farm": farm.name, "cells": list(cells.values()), "overall": overall, "meta": bench.meta}


def report(name: str, result: dict[str, Any]) -> None:
    print(f"\n{name}: peer seconds / farm seconds ({result['farm']}), > 1 means the farm is faster; "
          "wall time, and CPU time of the processes doing the work")  # fmt: skip
    head = (f"{'input':<46} {'peer':<40} {'farm s':>7} {'peer s':>7} {'ratio':>6} {'CPU ratio':>9}"
            "  ratios per pair")  # fmt: skip
    print(head + "\n" + "-" * (len(head) + 20))
    for c in result["cells"]:
        ratios = " ".join(f"{r:.2f}" for r in c["ratio"])
        cpu = f"{c['median_cpu_ratio']:.2f}" if c["median_cpu_ratio"] else "-"
        print(f"{c['input']:<46} {c['peer']:<40} {c['median_farm_s']:>7.3f} {c['median_peer_s']:>7.3f} "
              f"{c['median_ratio']:>6.2f} {cpu:>9}  {ratios}")  # fmt: skip
    print()
    for peer, o in result["overall"].items():
        cpu = f"{o['median_cpu_ratio']:.2f} ({o['cpu_pairs']} pairs)" if o["median_cpu_ratio"] else "-"
        print(f"{peer:<40} median ratio {o['median_ratio']:.2f} (min {o['min_ratio']:.2f}, max {o['max_ratio']:.2f}, "
              f"{o['pairs']} pairs), CPU {cpu}; same span count everywhere: {o['all_same_count']}, "
              f"largest boundary difference {o['max_boundary_ms']} ms")  # fmt: skip


def main() -> None:
    os.environ.update(ONE_THREAD)  # before numpy, torch or onnxruntime are imported
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="vad", help=f"comma-separated, or 'all': {', '.join(FAMILIES)}")
    ap.add_argument("--seconds", type=float, default=120, help="length of each generated input")
    ap.add_argument("--pairs", type=int, default=3, help="alternating pairs per input and peer")
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "mediafarm-peers",
                    help="generated inputs (kept and reused), the worker's media root, its log and Redis")  # fmt: skip
    args = ap.parse_args()
    names = list(FAMILIES) if args.family == "all" else args.family.split(",")
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        ap.error(f"unknown family {unknown}; known: {', '.join(FAMILIES)}")
    args.workdir = args.workdir.resolve()  # Redis and the worker run elsewhere: a relative folder would move
    args.workdir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    results = {}
    # An embedded Redis and the farm's settings, before any farm module is imported (the farm reads
    # them once), so nothing here reaches another Redis.
    with farm(args.workdir, models=args.workdir / "models"):
        for name in names:
            results[name] = run_family(FAMILIES[name](args, args.workdir), args.pairs)
            report(name, results[name])
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "command": " ".join([".venv/bin/python", "-m", "bench.peers", *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.gmtime(started)),
        "elapsed_s": round(time.time() - started, 1),
        "nproc": os.cpu_count(),
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
    }
    RESULTS.write_text(json.dumps({"meta": meta, "families": results}, indent=2))
    print(f"\nwrote {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    main()
