"""Which VAD spans the subtitle job sets aside as tonal, against the held-out corpus's truth (issue #35).

Run from the repository root::

    .venv/bin/python -m bench.tonal_spans --half tuning --workdir bench/results/heldout
    .venv/bin/python -m bench.tonal_spans --half heldout --names heldout-08,heldout-05 --workdir ...

On each track of the half (``tests.support.heldout_corpus``; only the tracks named are made), the
farm's VAD pass exactly as the job runs it (``engines.speech_only``: silero fed through the
spectral stability measure of ``tonal.py``). Every VAD span is put against the true speech spans:

- **speech**: it overlaps a true span. Set aside, it is speech dropped (the count that must be 0).
- **silence**: it overlaps none (a tone, a noise burst, a breath of synthesis). Kept, Whisper may
  hear words in it.

Printed: each span's stable share and pairs (the measure the threshold is set on), the counts of
each kind kept and set aside, and the CPU seconds of the VAD pass with and without the measure.
Results go to ``bench/results/tonal_spans.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.farm import REPO

RESULTS = REPO / "bench" / "results" / "tonal_spans.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--half", choices=("heldout", "tuning"), default="tuning")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "mediafarm-peers")
    ap.add_argument("--names", default=None, help="only these tracks of the half, comma-separated")
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args()

    from mediafarm.tasks.context import EngineContext
    from mediafarm.tasks.families.subtitle import engines, tonal
    from tests.support.heldout_corpus import make, recipes, split

    made = recipes()
    halves = dict(zip(("tuning", "heldout"), split([r.name for r in made]), strict=True))
    names = [n for n in halves[args.half] if args.names is None or n in args.names.split(",")]
    by_name = {r.name: r for r in made}
    rows: list[dict[str, Any]] = []
    cpu = {"vad": 0.0, "vad+tonal": 0.0}
    for name in names:
        track = make(by_name[name], args.workdir / "heldout-corpus")
        c0 = time.process_time()
        engines.speech_spans(EngineContext.local(), track.path)
        cpu["vad"] += time.process_time() - c0
        c0 = time.process_time()
        stability = tonal.SpectralStability()
        found = engines.speech_spans(EngineContext.local(), track.path, None, stability)
        kept, _ = tonal.set_aside(found.spans, stability)
        cpu["vad+tonal"] += time.process_time() - c0
        kept_at = {(s.start, s.end) for s in kept}
        for span in found.spans:
            share, pairs = stability.stable_share(span)
            overlap = sum(max(0.0, min(span.end, e) - max(span.start, s)) for s, e in track.truth)
            rows.append({"track": name, "start": round(span.start, 3), "end": round(span.end, 3),
                         "kind": "speech" if overlap > 0 else "silence", "share": round(share, 3), "pairs": pairs,
                         "set_aside": (span.start, span.end) not in kept_at})  # fmt: skip
    counts = {f"{kind} {'set aside' if aside else 'kept'}": sum(1 for r in rows if r["kind"] == kind and r["set_aside"] == aside)
              for kind in ("speech", "silence") for aside in (True, False)}  # fmt: skip
    for r in sorted(rows, key=lambda r: (r["kind"], -r["share"])):
        if r["kind"] == "silence" or r["share"] >= 0.1:
            print(f"{r['track']} {r['kind']:<7} {r['start']:8.2f}-{r['end']:<8.2f} share {r['share']:.2f} "
                  f"pairs {r['pairs']:>4} {'SET ASIDE' if r['set_aside'] else 'kept'}")  # fmt: skip
    top_speech = max((r["share"] for r in rows if r["kind"] == "speech" and r["pairs"] >= tonal.MIN_PAIRS), default=0.0)
    print(f"\n{args.half}: {len(names)} tracks, {len(rows)} spans; {counts}")
    print(f"highest stable share of a speech span (>= {tonal.MIN_PAIRS} pairs): {top_speech:.2f}; "
          f"threshold {tonal.TONAL_SHARE}")  # fmt: skip
    print(f"CPU s: {cpu['vad']:.2f} VAD alone, {cpu['vad+tonal']:.2f} with the measure "
          f"({cpu['vad+tonal'] / max(cpu['vad'], 1e-9):.2f}x)")  # fmt: skip
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps({
        "half": args.half, "tracks": names, "counts": counts, "top_speech_share": top_speech,
        "threshold": tonal.TONAL_SHARE, "cpu": cpu, "spans": rows,
        "command": " ".join([".venv/bin/python", "-m", "bench.tonal_spans", *sys.argv[1:]]),
    }, indent=1))  # fmt: skip
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
