"""Subtitle engines: VAD first, then recognition of the speech alone, streamed, then cues and files.

Both rungs' engines (``whisper``, ``pocketsphinx``) run the same pipeline with their own
recogniser:

1. The farm's streaming VAD finds the speech spans (silero; webrtcvad if silero is missing). Spans
   that are held notes or chords, not speech, are set aside (tonal.py, measured on the same pass)
   and listed in the result.
2. One more streaming decode cuts the speech out. Neighbouring spans are packed into windows
   (windows.py) of up to ``WINDOW_SECONDS`` of speech (``FITTED_WINDOW_SECONDS`` where Whisper's
   encoder is fitted to the window: recognisers.encoder_frames), joined by a short silence; the silence
   between spans is never recognised (it is where Whisper hallucinates). Each word's edges are
   refined against the window's own sound (onsets.py: no word starts or ends in silence, an
   utterance's cue starts at its onset), then every recognised time is mapped back, piece by
   piece, to the media's clock.
3. Words become cues as windows finish (cue_stream.py); cues that later words can no longer
   change are final and go out at once as time-windowed WebVTT segments (artifacts under ``chunks/``, each announced as
   a partial output). The HLS playlist ``chunks/playlist.m3u8`` is rewritten (atomically) after
   each batch of new segments, an EVENT playlist that only grows, and gets ``#EXT-X-ENDLIST`` at
   the end, so a player can follow a long job.
4. At the end: ``subtitles.json`` (canonical: segments with words, language, rung, cue rules,
   cues, timestamp checks), and WebVTT/SRT of the whole media.

Memory stays flat with the media's length: at most one window of audio is held, segments are
written to the JSON file as they come, and only cues and speech spans (a few KB an hour) are kept.
The one exception is the VAD pass's tonal measure (900 KB an hour), let go once the spans are judged.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mediafarm.tasks.families.subtitle import onsets, tonal
from mediafarm.tasks.families.subtitle.checks import SilentWords, timing_report
from mediafarm.tasks.families.subtitle.cue_stream import CueStream, JsonSegments
from mediafarm.tasks.families.subtitle.recognisers import (
    Recognition,
    load_pocketsphinx,
    load_whisper,
    transcribe_pocketsphinx,
    transcribe_whisper,
    transcribe_whisper_batch,
)
from mediafarm.tasks.families.subtitle.records import Cue, RejectedSpan, Segment
from mediafarm.tasks.families.subtitle.resume import JOURNAL, STATE_VERSION, Journal, Resumed, tag_cues, vad_state
from mediafarm.tasks.families.subtitle.second_look import second_look
from mediafarm.tasks.families.subtitle.spec import (
    UNSURE_BELOW,
    Confidence,
    SubtitleRequest,
    SubtitleResult,
    WhisperParams,
)
from mediafarm.tasks.families.subtitle.windows import (
    FITTED_WINDOW_SECONDS,
    PAD_SECONDS,
    WINDOW_SECONDS,
    Window,
    cut_windows,
    plan_windows,
)
from mediafarm.tasks.families.subtitle.writers import ChunkedWebVTT, segment_name, to_srt, to_webvtt
from mediafarm.tasks.families.vad import engines as vad
from mediafarm.tasks.families.vad.spec import FAMILY as VAD_FAMILY
from mediafarm.tasks.families.vad.spec import SileroParams, VadRequest, VadResult, WebrtcParams
from mediafarm.tasks.kit import EngineContext, NoParams, made_until
from mediafarm.tasks.kit.media import KeptAudio, audio_blocks

# VAD for subtitles: a shorter silence ends a span than for cam-filter, so cue onsets can follow it.
VAD_PARAMS = SileroParams(threshold=0.5, min_silence_ms=250, speech_pad_ms=30)
# Audio up to this long is decoded once, for the VAD and then for recognition (held meanwhile,
# 38 MB); longer audio is decoded twice, so memory does not grow with the media's length.
KEEP_AUDIO_SECONDS = 600.0
# Shares of the job's progress: the VAD pass is cheap next to recognition.
VAD_SHARE = 0.15

JSON_NAME, VTT_NAME, SRT_NAME = "subtitles.json", "subtitles.vtt", "subtitles.srt"
CHUNKS = "chunks"
PLAYLIST = f"{CHUNKS}/playlist.m3u8"


Recognise = Callable[[np.ndarray], Recognition]
# Several windows at once (a batch on the accelerator), one Recognition per window, in order.
RecogniseBatch = Callable[[list[np.ndarray]], list[Recognition]]


def whisper(
    ctx: EngineContext, request: SubtitleRequest, params: WhisperParams
) -> Generator[Any, None, SubtitleResult]:
    """faster-whisper on the speech; the model comes from the models dir, never from a hub."""
    model = load_whisper(ctx.model_path(params.model), ctx.device, params.compute_type, params.cpu_threads)
    # A resumed attempt keeps the language its first attempt heard (resume.py).
    language = request.language or _resumed_language(ctx, batched=params.batch_size > 1)

    def recognise(audio: np.ndarray) -> Recognition:
        nonlocal language
        heard = transcribe_whisper(
            model, audio, offset=0.0, language=language, beam_size=params.beam_size, fit_context=params.fit_context
        )
        # The first window's language holds for the rest, so one medium is not split across two.
        language = language or heard.language
        return heard

    def recognise_batch(audios: list[np.ndarray]) -> list[Recognition]:
        nonlocal language
        heard = transcribe_whisper_batch(
            model, audios, language=language, beam_size=params.beam_size, batch_size=params.batch_size,
            fit_context=params.fit_context,
        )  # fmt: skip
        language = language or next((h.language for h in heard if h.segments), None)
        return heard

    batched = recognise_batch if params.batch_size > 1 else None
    # "relook": a checkpoint of an engine without the second look is not this recogniser's own.
    identity = {"engine": "whisper", "relook": 1, **params.model_dump(mode="json")}
    # Whisper may skip a stretch of a long window whole: what it missed gets a second look (second_look.py).
    window = FITTED_WINDOW_SECONDS if params.fit_context else WINDOW_SECONDS
    return (yield from transcribe(ctx, request, recognise, batched, params.batch_size, identity=identity, relook=True,
                                  window_seconds=window))  # fmt: skip


def pocketsphinx(
    ctx: EngineContext, request: SubtitleRequest, params: NoParams
) -> Generator[Any, None, SubtitleResult]:
    """pocketsphinx (en-US, the model inside its wheel) on the speech: the rung that is always there."""
    decoder = load_pocketsphinx()

    def recognise(audio: np.ndarray) -> Recognition:
        return transcribe_pocketsphinx(decoder, audio, offset=0.0)

    return (yield from transcribe(ctx, request, recognise, identity={"engine": "pocketsphinx"}))


def transcribe(
    ctx: EngineContext,
    request: SubtitleRequest,
    recognise: Recognise,
    recognise_batch: RecogniseBatch | None = None,
    batch_size: int = 1,
    *,
    identity: Mapping[str, Any] | None = None,
    relook: bool = False,
    window_seconds: float = WINDOW_SECONDS,
) -> Generator[Any, None, SubtitleResult]:
    """The pipeline of the module docstring; yields each finished WebVTT segment's artifact name.
    With ``recognise_batch``, windows are recognised ``batch_size`` at a time. ``identity`` (the
    engine and its parameters) tells a resumed attempt whether the recogniser that made its
    checkpoint is its own (resume.py). ``window_seconds``: the longest window (a resumed attempt
    plans its windows as the checkpoint's attempt did, so that the windows done are the same)."""
    path = Path(request.media)
    resumed = Resumed.of(ctx.resume, identity or {})
    audio = KeptAudio(path, KEEP_AUDIO_SECONDS)
    if resumed is not None:
        vad, rejected = resumed.vad(), resumed.rejected()
    else:
        vad, rejected = speech_only(ctx.part(0.0, VAD_SHARE), path, audio)
    if resumed is not None:
        window_seconds = resumed.window_seconds
    windows = plan_windows(vad.spans, vad.duration, window_seconds)
    speech_total = sum(p.end - p.start for w in windows for p in w.pieces) or 1.0
    recognising = ctx.part(VAD_SHARE, 1.0)
    cues = CueStream(request)
    chunks = ChunkedWebVTT(window_seconds=request.chunk_seconds)
    silent_words = SilentWords(vad.spans, PAD_SECONDS)
    heard_language: tuple[str, float | None] | None = None
    model_name = ""
    words = 0
    probabilities: list[float] = []
    done = 0.0
    journal = Journal(ctx)
    first_language: str | None = None  # what the recogniser heard in the first window (whisper's, kept)
    skip = resumed.windows if resumed is not None else 0
    with ctx.artifacts.open(JSON_NAME, "w", encoding="utf-8") as canonical:
        segments_out = JsonSegments(canonical)
        if resumed is not None:  # what the attempts before made, back in place (resume.py)
            for kind, value in resumed.journal(ctx):
                if kind == "cue":
                    cues.all.append(Cue.model_validate(value))
                    continue
                mapped = Segment.model_validate(value)
                segments_out.write(mapped)
                silent_words.add(mapped.words)
                words += len(mapped.words)
                probabilities += [w.probability for w in mapped.words if w.probability is not None]
            journal.parts = [n for n in resumed.checkpoint.files if n.startswith(f"{JOURNAL}/")]
            chunks.restore(resumed.chunk_state())
            cues.restore(resumed.pending_words())
            heard_language = _pair(resumed.state["heard_language"])
            model_name = str(resumed.state["model"])
            done = sum(w.speech_seconds for w in windows[:skip])
            first_language = resumed.state.get("first_language")
        journaled = len(cues.all)  # the cues already in the journal; the next checkpoint keeps those after
        if resumed is not None and not resumed.exact:  # another recogniser: the kept words become cues first
            at = resumed.checkpoint.position
            yield from _publish(ctx, chunks, chunks.add(cues.take_rest(), final_until=at))
        last_model = model_name
        for index, (window, heard) in enumerate(
            recognised(ctx, audio, windows[skip:], recognise, recognise_batch, batch_size, relook), start=skip + 1
        ):
            last_model = heard.model
            first_language = first_language or heard.language
            if heard_language is None and heard.segments:
                heard_language = (heard.language, heard.language_probability)
            for segment in heard.segments:
                mapped = window.to_media(segment)
                if mapped.words:
                    segments_out.write(mapped)
                    journal.segment(mapped)
                    cues.add(mapped.words)
                    silent_words.add(mapped.words)
                    words += len(mapped.words)
                    probabilities += [w.probability for w in mapped.words if w.probability is not None]
            done += window.speech_seconds
            recognising.progress(done / speech_total, stage="recognise", media_seconds=window.end)
            final_until = cues.final_until(window.end)
            yield from _publish(ctx, chunks, chunks.add(cues.take_final(), final_until=final_until))
            # A batch is recognised whole: a checkpoint between two batches only (module resume.py).
            if index % batch_size == 0 and ctx.checkpoint_due():
                journal.cues(cues.all[journaled:])
                journaled = len(cues.all)
                journal.flush()
                ctx.checkpoint(window.end, {
                    "subtitle": STATE_VERSION, "identity": dict(identity or {}), "windows": index,
                    "window_seconds": window_seconds,
                    "vad": vad_state(vad), "rejected": [r.model_dump(mode="json") for r in rejected],
                    "pending": [w.model_dump(mode="json") for w in cues.pending],
                    "chunks": chunks.state(), "heard_language": list(heard_language) if heard_language else None,
                    "model": _models(model_name, last_model), "first_language": first_language,
                }, files=[*journal.parts, *(f"{CHUNKS}/{segment_name(k)}" for k in range(chunks.segment_count)),
                          *([PLAYLIST] if chunks.segment_count else [])])  # fmt: skip
        model_name = _models(model_name, last_model)
        yield from _publish(ctx, chunks, chunks.add(cues.take_rest(), final_until=vad.duration))
        yield from _publish(ctx, chunks, chunks.close(vad.duration), ended=True)
        language, probability = _language(request, heard_language)
        report = timing_report(
            cues.all, vad.spans, vad.duration, request.rules, words_in_silence=silent_words.count,
            refined_by=onsets.METHOD,
        )  # fmt: skip
        parts = resumed.parts(ctx.rung, vad.duration) if resumed else made_until(None, ctx.rung, vad.duration)
        segments_out.close(
            language=language, language_probability=probability, model=model_name or "none", rung=ctx.rung,
            variant=ctx.rung,  # the rung's name as the release before called it, written for one release
            duration=round(vad.duration, 3), speech=[s.to_json() for s in vad.spans],
            rules=request.rules.model_dump(mode="json"),
            cues=[c.model_dump(mode="json") for c in tag_cues(cues.all, parts)],
            timing=report.model_dump(mode="json"), made=[p.to_json() for p in parts],
            rejected=[r.model_dump(mode="json") for r in rejected],
        )  # fmt: skip
    journal.remove()
    files = {"json": JSON_NAME}
    if "vtt" in request.formats:
        ctx.artifacts.write_text(VTT_NAME, to_webvtt(cues.all))
        files["vtt"] = VTT_NAME
    if "srt" in request.formats:
        ctx.artifacts.write_text(SRT_NAME, to_srt(cues.all))
        files["srt"] = SRT_NAME
    return SubtitleResult(
        language=language, language_probability=probability, model=model_name or "none",
        duration=round(vad.duration, 3), speech_seconds=round(sum(s.end - s.start for s in vad.spans), 3),
        spans=len(vad.spans), words=words, cues=len(cues.all), rules=request.rules, timing=report, files=files,
        playlist=PLAYLIST, confidence=confidence(probabilities),
        made=list(parts) if resumed is not None else [], rejected=rejected,
    )  # fmt: skip


def confidence(probabilities: Sequence[float]) -> Confidence:
    """The recogniser's word probabilities summed up: mean, and the share under ``UNSURE_BELOW``."""
    if not probabilities:
        return Confidence()
    unsure = sum(1 for p in probabilities if p < UNSURE_BELOW)
    return Confidence(scored=len(probabilities), mean=round(sum(probabilities) / len(probabilities), 4),
                      unsure_share=round(unsure / len(probabilities), 4))  # fmt: skip


def _language(request: SubtitleRequest, heard: tuple[str, float | None] | None) -> tuple[str, float | None]:
    if request.language is not None:
        return request.language, None
    return heard if heard is not None else ("und", None)


def _publish(
    ctx: EngineContext, chunks: ChunkedWebVTT, segments: Sequence[tuple[str, str]], *, ended: bool = False
) -> Iterator[dict[str, str]]:
    """Write the new ``segments``, then the playlist that lists them (``ended``: the last one, with
    ``#EXT-X-ENDLIST``), then announce each segment as a partial output.

    Segments go first: a player polling the playlist must never be sent to a segment that is not
    there yet. Every artifact write is a rename of a complete file, so the playlist it reads is
    always whole, and each one only appends to the one before (RFC 8216, an EVENT playlist).
    """
    for name, text in segments:
        ctx.artifacts.write_text(f"{CHUNKS}/{name}", text)
    if segments or ended:
        ctx.artifacts.write_text(PLAYLIST, chunks.playlist(ended=ended))
    for name, _ in segments:
        yield {"segment": f"{CHUNKS}/{name}"}


def speech_only(
    ctx: EngineContext, path: Path, audio: KeptAudio | None = None
) -> tuple[VadResult, list[RejectedSpan]]:
    """The VAD's spans with the tonal ones (held notes, chords) set aside, and those set aside:
    measured on the VAD's own pass (tonal.py), so the audio is decoded no extra time."""
    stability = tonal.SpectralStability()
    found = speech_spans(ctx, path, audio, stability)
    kept, rejected = tonal.set_aside(found.spans, stability)
    return found.model_copy(update={"spans": kept}), rejected


def speech_spans(
    ctx: EngineContext, path: Path, audio: KeptAudio | None = None, stability: tonal.SpectralStability | None = None
) -> VadResult:
    """The farm's own streaming VAD: silero, or webrtcvad on a pool without silero (as the VAD
    family's own needs for silero say). The job's checkpoints are the subtitle engine's, not the VAD's.
    ``audio``: the VAD decodes through it, which keeps short audio for recognition. ``stability``:
    fed every block the VAD reads."""
    read = audio.blocks if audio is not None else audio_blocks
    decode = read if stability is None else _feeding(read, stability)
    if VAD_FAMILY.engines["silero"].missing() is None:
        return vad.silero(ctx, VadRequest(media=str(path)), VAD_PARAMS, resumable=False, decode=decode)
    return vad.webrtc(ctx, VadRequest(media=str(path)), WebrtcParams(min_silence_ms=250), resumable=False,
                      decode=decode)  # fmt: skip


def _feeding(
    read: Callable[[Path], Iterable[np.ndarray]], stability: tonal.SpectralStability
) -> Callable[[Path], Iterator[np.ndarray]]:
    """``read`` with each block it yields fed to ``stability`` on the way."""

    def decode(path: Path) -> Iterator[np.ndarray]:
        for block in read(path):
            stability.feed(block)
            yield block

    return decode


def _resumed_language(ctx: EngineContext, *, batched: bool) -> str | None:
    """The language a resumed attempt's recogniser keeps: the one its first attempt heard first."""
    state = ctx.resume.state if ctx.resume is not None else {}
    if state.get("subtitle") != STATE_VERSION:
        return None
    heard, first = state.get("heard_language"), state.get("first_language")
    # As the recogniser itself picks it: one window a call, the first window's; batched, the first with words.
    return (heard[0] if heard else None) if batched else (first or (heard[0] if heard else None))


def _pair(value: Any) -> tuple[str, float | None] | None:
    return (str(value[0]), value[1]) if value else None


def _models(before: str, mine: str) -> str:
    """The recogniser named in the result: each that made a part, once, in order."""
    names = [m for m in before.split(" + ") if m] if before else []
    return " + ".join(names if not mine or mine in names else [*names, mine])


def recognised(
    ctx: EngineContext,
    source: KeptAudio,
    windows: Sequence[Window],
    recognise: Recognise,
    recognise_batch: RecogniseBatch | None = None,
    batch_size: int = 1,
    relook: bool = False,
) -> Iterator[tuple[Window, Recognition]]:
    """Each window with what was heard in it, in order: one at a time, or ``batch_size`` windows a
    call with ``recognise_batch`` (at most that many windows of audio held: memory stays flat).
    ``relook``: pieces a window's recognition left without a word are recognised again alone."""
    again = recognise if relook else None
    if recognise_batch is None or batch_size <= 1:
        for window, audio in cut_windows(source, windows):
            ctx.check_cancelled()
            yield from _refined([(window, audio)], [recognise(audio)], again)
        return
    batch: list[tuple[Window, np.ndarray]] = []
    for item in cut_windows(source, windows):
        batch.append(item)
        if len(batch) == batch_size:
            ctx.check_cancelled()
            yield from _refined(batch, recognise_batch([a for _, a in batch]), again)
            batch = []
    if batch:
        ctx.check_cancelled()
        yield from _refined(batch, recognise_batch([a for _, a in batch]), again)


def _refined(
    batch: list[tuple[Window, np.ndarray]], heard: list[Recognition], relook: Recognise | None
) -> Iterator[tuple[Window, Recognition]]:
    """Each window's words, the pieces it missed looked at again (second_look.py) when ``relook``
    is given, with their edges refined against its own audio (onsets.py)."""
    for (window, audio), recognition in zip(batch, heard, strict=True):
        if relook is not None:
            recognition = second_look(recognition, audio, window.spans(), relook)
        yield window, onsets.refine_heard(recognition, audio, window.spans())
