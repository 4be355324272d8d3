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

With ``--words``, also the words: the farm's engine on the ``whisper-tiny`` rung's params (in this
process, one CPU thread, as bench/heldout_where.py runs it) with nothing set aside ("before": a
threshold no span reaches) and as the job runs ("after"): errors against the reference, words in
true silence (``subtitle_tracks.words_in_silence``: midpoint more than 0.5 s from every true span)
and CPU seconds. Results go to ``bench/results/tonal_spans.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.farm import REPO
from bench.peers import ONE_THREAD

RESULTS = REPO / "bench" / "results" / "tonal_spans.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--half", choices=("heldout", "tuning"), default="tuning")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "mediafarm-peers")
    ap.add_argument("--names", default=None, help="only these tracks of the half, comma-separated")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--words", action="store_true", help="also recognise each track, before and after")
    args = ap.parse_args()
    os.environ.update(ONE_THREAD)

    from mediafarm.tasks.families.subtitle import engines, tonal
    from mediafarm.tasks.runtime.context import EngineContext
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
    words = {name: recognised(make(by_name[name], args.workdir / "heldout-corpus"), args.workdir)
             for name in names} if args.words else {}  # fmt: skip
    counts = {f"{kind} {'set aside' if aside else 'kept'}":
              sum(r["kind"] == kind and r["set_aside"] == aside for r in rows)
              for kind in ("speech", "silence") for aside in (True, False)}  # fmt: skip
    for r in sorted(rows, key=lambda r: (r["kind"], -r["share"])):
        if r["kind"] == "silence" or r["share"] >= 0.1:
            print(f"{r['track']} {r['kind']:<7} {r['start']:8.2f}-{r['end']:<8.2f} share {r['share']:.2f} "
                  f"pairs {r['pairs']:>4} {'SET ASIDE' if r['set_aside'] else 'kept'}")  # fmt: skip
    judged = [r["share"] for r in rows if r["kind"] == "speech" and r["pairs"] >= tonal.MIN_PAIRS]
    top_speech = max(judged, default=0.0)
    print(f"\n{args.half}: {len(names)} tracks, {len(rows)} spans; {counts}")
    print(f"highest stable share of a speech span (>= {tonal.MIN_PAIRS} pairs): {top_speech:.2f}; "
          f"threshold {tonal.TONAL_SHARE}")  # fmt: skip
    print(f"CPU s: {cpu['vad']:.2f} VAD alone, {cpu['vad+tonal']:.2f} with the measure "
          f"({cpu['vad+tonal'] / max(cpu['vad'], 1e-9):.2f}x)")  # fmt: skip
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps({
        "half": args.half, "tracks": names, "counts": counts, "top_speech_share": top_speech,
        "threshold": tonal.TONAL_SHARE, "cpu": cpu, "spans": rows, "words": words,
        "command": " ".join([".venv/bin/python", "-m", "bench.tonal_spans", *sys.argv[1:]]),
    }, indent=1))  # fmt: skip
    print(f"wrote {args.results}")


def recognised(track: Any, workdir: Path) -> dict[str, dict[str, Any]]:
    """The engine's errors, words in true silence and CPU on ``track``, before and after."""
    from bench.peers_subtitle import engine_words, linked_models
    from mediafarm.tasks.families.subtitle import tonal
    from mediafarm.tasks.families.subtitle.spec import FAMILY, WhisperParams
    from tests.support.subtitle_tracks import word_errors, words_in_silence

    params = WhisperParams(**next(r for r in FAMILY.ladder if r.name == "whisper-tiny").params)
    models, chosen = linked_models(workdir), tonal.TONAL_SHARE
    out = {}
    try:
        for label, threshold in (("before", math.inf), ("after", chosen)):
            tonal.TONAL_SHARE = threshold
            c0 = time.process_time()
            heard = engine_words(models, str(track.path), params)
            cpu = time.process_time() - c0
            silent = [w for w in heard if words_in_silence([(w[1], w[2])], track.truth)]
            out[label] = {"errors": word_errors(track.words, [w for w, _, _ in heard]), "ref_words": len(track.words),
                          "words_in_silence": len(silent), "silent": silent, "cpu": round(cpu, 2)}  # fmt: skip
            print(f"{track.name} {label:<6} {out[label]}", flush=True)
    finally:
        tonal.TONAL_SHARE = chosen
    return out


if __name__ == "__main__":
    main()
