"""The live subtitle engine: a stream in, WebVTT segments and an HLS playlist out as cues become final.

One loop, as the audio arrives (``LiveSource`` decodes the stream to 16 kHz mono with its PTS):

1. The samples go through silero-vad (the VAD family's model and span rules, fed a few windows at a
   time) and into a rolling buffer that holds only the audio not yet recognised.
2. A speech span the VAD closes is cut out with the file engine's padding and recognised at once
   (a span open longer than ``MAX_SPAN_SECONDS`` is cut there, so a monologue is not held back;
   a child that has fallen behind the stream gathers spans into one call until it catches up);
   its words are mapped to the cue clock (``clock.StreamClock``: the stream's PTS, re-anchored at
   every frame, a timestamp jump absorbed and recorded) and go into the file engine's ``CueStream``.
3. Cues are final when the file rules say so, or when the stream has been silent for the cue rules'
   sentence pause after the last word (live knows the pause is there without waiting for the next
   word). Final cues go into the file writers' ``ChunkedWebVTT``; each window that no later cue can
   reach is written as a segment, the EVENT playlist is rewritten after it, and the segment is
   announced as a partial output. Segments carry an ``X-TIMESTAMP-MAP`` tying cue time 0 to the
   stream's own MPEG-TS time.
4. After each publish the attempt checkpoints (segments, playlist, cues, speech spans, clock). A
   killed attempt's successor reopens the stream, joins it at its live edge, and records the stream
   time between the checkpoint and that edge as a gap (``#EXT-X-GAP`` on segments wholly inside it,
   and in the timing report): nothing is made up for it.
5. The job ends when the stream ends (EOF), stalls past ``stall_timeout_s``, reaches the operator's
   ``FARM_LIVE_MAX_SECONDS``, or is cancelled; the whole-stream WebVTT/SRT/JSON are written then.

Latency, measured per cue: from the moment the audio of the utterance's end was sent (placed by
the stream's own real-time pace, ``Arrivals``: time waiting in the socket counts) to the moment the
cue's segment and the playlist listing it were written.
"""

from __future__ import annotations

import bisect
import json
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

import numpy as np

from mediafarm.tasks.families.subtitle.checks import SilentWords, timing_report
from mediafarm.tasks.families.subtitle.engines import VAD_PARAMS
from mediafarm.tasks.families.subtitle.recognisers import (
    Recognition,
    load_pocketsphinx,
    load_whisper,
    transcribe_pocketsphinx,
    transcribe_whisper,
)
from mediafarm.tasks.families.subtitle.records import Word
from mediafarm.tasks.families.subtitle.spec import WhisperParams
from mediafarm.tasks.families.subtitle.windows import JOIN_SECONDS, PAD_SECONDS, Piece, Window
from mediafarm.tasks.families.subtitle.writers import to_srt, to_webvtt
from mediafarm.tasks.families.subtitle_live.buffer import Arrivals, AudioBuffer
from mediafarm.tasks.families.subtitle_live.job_state import LiveJob, cue_key
from mediafarm.tasks.families.subtitle_live.playlist import CHUNKS, PLAYLIST
from mediafarm.tasks.families.subtitle_live.push import PushEnded, PushSource, PushTaken, is_push_url
from mediafarm.tasks.families.subtitle_live.source import LiveSource, SourceEnded
from mediafarm.tasks.families.subtitle_live.spec import (
    Gap,
    LiveSettings,
    LiveSubtitleRequest,
    LiveSubtitleResult,
    LiveTimingReport,
)
from mediafarm.tasks.families.vad.engines import SILERO_WINDOW
from mediafarm.tasks.families.vad.streaming import StreamingSilero
from mediafarm.tasks.kit import EngineContext, InvalidRequest, NoParams, Span, UnreadableMedia
from mediafarm.tasks.kit.media import SAMPLE_RATE

JSON_NAME, VTT_NAME, SRT_NAME = "subtitles.json", "subtitles.vtt", "subtitles.srt"
# A span still open after this long is recognised up to here (a monologue without pauses).
MAX_SPAN_SECONDS = 8.0
# Silero runs once this many 32 ms windows are in (~0.16 s): cheap, and well under the VAD's 250 ms.
VAD_BATCH = 5
# How far before the VAD's decoding position a span not yet found may still start: silero's own pad
# and one window of decision lag, then the padding speech is cut with, and rounding to spare.
LOOKBACK_SECONDS = (VAD_PARAMS.speech_pad_ms / 1000) + SILERO_WINDOW / SAMPLE_RATE + PAD_SECONDS + 0.05
CANCEL_CHECK_SECONDS = 0.5
# Behind the stream by more than this (frames waited in the socket), spans are gathered into one
# recogniser call of up to BACKLOG_SECONDS of speech (``_recognise_now``).
CATCH_UP_SECONDS = 1.0
BACKLOG_SECONDS = 10.0
ONSET_SNAP_SECONDS = 0.4
# A resumed attempt whose first frame is this close to its checkpoint missed nothing (a sample's rounding).
JOIN_TOLERANCE_SECONDS = 0.002

Recognise = Callable[[np.ndarray], Recognition]


def whisper(
    ctx: EngineContext, request: LiveSubtitleRequest, params: WhisperParams
) -> Generator[Any, None, LiveSubtitleResult]:
    """faster-whisper on each utterance of the stream as the VAD closes it."""
    model = load_whisper(ctx.model_path(params.model), ctx.device, params.compute_type, params.cpu_threads)
    language = request.language or _resumed_language(ctx)

    def recognise(audio: np.ndarray) -> Recognition:
        nonlocal language
        heard = transcribe_whisper(
            model, audio, offset=0.0, language=language, beam_size=params.beam_size, fit_context=params.fit_context
        )
        language = language or (heard.language if heard.segments else None)
        return heard

    return (yield from run_live(ctx, request, recognise))


def pocketsphinx(
    ctx: EngineContext, request: LiveSubtitleRequest, params: NoParams
) -> Generator[Any, None, LiveSubtitleResult]:
    """pocketsphinx (en-US) on each utterance: the rung that is always there."""
    decoder = load_pocketsphinx()
    return (yield from run_live(ctx, request, lambda audio: transcribe_pocketsphinx(decoder, audio, offset=0.0)))


def _resumed_language(ctx: EngineContext) -> str | None:
    state = ctx.resume.state if ctx.resume is not None else {}
    return state.get("language") if state.get("language") not in (None, "und") else None


def run_live(
    ctx: EngineContext, request: LiveSubtitleRequest, recognise: Recognise
) -> Generator[Any, None, LiveSubtitleResult]:
    """The loop of the module docstring; yields each written segment's artifact name."""
    settings = LiveSettings()
    job = LiveJob(ctx, request)
    vad = StreamingSilero(VAD_PARAMS, VAD_BATCH)
    audio = AudioBuffer()
    arrivals = Arrivals()
    # FARM_LIVE_MAX_SECONDS bounds the time attempts run, not the wall clock since the first one: a
    # job whose worker died comes back after the broker's visibility timeout, which is longer than
    # the family's hard limit and so than the maximum itself.
    deadline = job.started_at + settings.max_seconds - job.ran_before
    end_reason = ""
    next_cancel_check = 0.0
    ctx.progress(None, stage="connecting")
    source = _open_source(ctx, request, job)
    try:
        with source:
            for pts, samples in source.frames():
                now = time.time()
                at = audio.end
                joining = not job.clock.anchored and job.resumed_at is not None
                job.clock.anchor(at, pts)
                if joining and job.clock.anchored:
                    _join_live_edge(job, at)
                audio.append(samples)
                arrivals.add(job.clock.time_at(audio.end), now)
                job.backlog += vad.feed(samples)
                open_start = vad.open_start
                if open_start is not None and (vad.fed - open_start) / SAMPLE_RATE > MAX_SPAN_SECONDS:
                    cut = vad.cut_open(vad.fed)
                    if cut is not None:
                        job.backlog.append(cut)
                if job.backlog and _recognise_now(job, arrivals, now):
                    _recognise(job, audio, vad, recognise)
                yield from _settle(job, vad, audio, arrivals, ended=False)
                if now >= next_cancel_check:
                    ctx.check_cancelled()
                    ctx.progress(None, stage="live", media_seconds=round(job.clock.time_at(audio.end), 3))
                    next_cancel_check = now + CANCEL_CHECK_SECONDS
                if now >= deadline:
                    end_reason = f"maximum duration reached (FARM_LIVE_MAX_SECONDS = {settings.max_seconds} s)"
                    break
            else:
                end_reason = "ended: the stream ended"
    except (SourceEnded, PushEnded) as exc:
        end_reason = str(exc)
    except PushTaken as exc:
        raise InvalidRequest(f"subtitle-live request: {exc}") from None
    last = vad.finish()
    if last is not None:
        job.backlog.append(last)
    if job.backlog:
        _recognise(job, audio, vad, recognise)
    duration = max(job.clock.time_at(audio.end), job.final_until)
    yield from _settle(job, vad, audio, arrivals, ended=True, duration=duration)
    result = _finish(ctx, job, end_reason, duration)
    if isinstance(source, PushSource):
        source.done()  # the job has ended for good: a killed attempt never gets here, its successor reads on
    return result


def _open_source(ctx: EngineContext, request: LiveSubtitleRequest, job: LiveJob) -> LiveSource | PushSource:
    """The stream's reader. A pushed stream is the farm's own Redis, which keeps its audio a while:
    an attempt that resumes reads it again from its checkpoint (``LiveJob.replay``) instead of
    joining the live edge, so a lost attempt costs no stream time. Other sources cannot be rewound."""
    if not is_push_url(request.stream):
        return LiveSource(request.stream, stall_timeout=request.stall_timeout_s)
    if ctx.redis is None:
        raise UnreadableMedia(f"stream {request.stream}: a pushed stream is read from the farm's Redis, "
                              "and this engine was given none")  # fmt: skip
    start = None
    if job.resumed_at is not None and job.clock.origin is not None:
        start = job.resumed_at + job.clock.origin + job.clock.offset
        job.replay()
    return PushSource(ctx.redis, request.stream, stall_timeout=request.stall_timeout_s, reader=ctx.job_id,
                      start_pts=start)  # fmt: skip


def _join_live_edge(job: LiveJob, at: int) -> None:
    """The first frame of an attempt that resumed: the stream time since the checkpoint is a gap."""
    resumed_at, job.resumed_at = job.resumed_at, None
    assert resumed_at is not None
    edge = job.clock.time_at(at)
    if abs(edge - resumed_at) < JOIN_TOLERANCE_SECONDS:
        return  # the stream read again from the checkpoint (a push): nothing missed
    if edge < resumed_at:
        # The stream's timestamps went back across the restart (a restarted sender): a jump, absorbed.
        job.clock.hold(resumed_at)
        edge = resumed_at
    if edge > resumed_at:
        where = "the oldest audio the push still kept" if is_push_url(job.request.stream) else "the live edge"
        reason = f"attempt {job.attempts - 1} was lost; attempt {job.attempts} joined {where}"
        job.gaps.append(Gap(start=round(resumed_at, 3), end=round(edge, 3), reason=reason))


def _recognise_now(job: LiveJob, arrivals: Arrivals, now: float) -> bool:
    """Recognise the closed spans now, or wait for more? Now, while the attempt keeps up with the
    stream (latency first: one recogniser call an utterance). A child that has fallen behind (its
    frames waited in the socket past ``CATCH_UP_SECONDS``) gathers spans into one call of up to
    ``BACKLOG_SECONDS`` of speech instead, as the file engine's windows do: a Whisper call costs
    about the same for 2 s as for 20 s, so it catches up rather than falling further behind."""
    sent = arrivals.wall_of(job.clock.time_at(job.backlog[-1][1]))
    behind = now - sent if sent is not None else 0.0
    speech = sum(b - a for a, b in job.backlog) / SAMPLE_RATE
    return behind <= CATCH_UP_SECONDS or speech >= BACKLOG_SECONDS


def _recognise(job: LiveJob, audio: AudioBuffer, vad: StreamingSilero, recognise: Recognise) -> None:
    """Recognise the closed spans of the backlog (samples) in one call, padded and joined by short
    silences as the file engine's windows are, and feed their words to the cues."""
    spans, job.backlog = job.backlog, []
    clock = job.clock
    pad = round(PAD_SECONDS * SAMPLE_RATE)
    speech = [Span(round(clock.time_at(a), 3), round(clock.time_at(b), 3)) for a, b in spans]
    job.speech += [s for s in speech if s.end > s.start]
    ranges: list[list[int]] = []
    for a, b in spans:
        first, last = max(audio.start, a - pad), min(audio.end, b + pad)
        if ranges and first <= ranges[-1][1]:
            ranges[-1][1] = max(ranges[-1][1], last)
        elif last - first >= SAMPLE_RATE // 10:
            ranges.append([first, last])
    if ranges:
        join = np.zeros(round(JOIN_SECONDS * SAMPLE_RATE), dtype=np.float32)
        pieces, parts, at = [], [], 0.0
        for first, last in ranges:
            if parts:
                parts.append(join)
                at += JOIN_SECONDS
            parts.append(audio.cut(first, last))
            pieces.append(Piece(clock.time_at(first), clock.time_at(first) + (last - first) / SAMPLE_RATE, at))
            at += (last - first) / SAMPLE_RATE
        heard = recognise(np.concatenate(parts))
        job.model = heard.model
        if job.language is None and heard.segments:
            job.language = heard.language
        window = Window(pieces)
        checker = SilentWords(speech, PAD_SECONDS)
        claimed: set[int] = set()  # spans whose first word is placed
        for segment in heard.segments:
            words = _from_onsets(window.to_media(segment).words, speech, claimed)
            if words:
                job.cues.add(words)
                checker.add(words)
                job.words += len(words)
        job.silent_words += checker.count
    keep = spans[-1][1] if vad.open_start is None else min(spans[-1][1], vad.open_start)
    audio.drop_before(keep - pad)


def _from_onsets(words: Sequence[Word], speech: Sequence[Span], claimed: set[int]) -> list[Word]:
    """The first word of each speech span starts at the span's onset, which the VAD found on the
    audio itself; the recogniser's own word times are coarser (tiny.en puts a clip's first word at
    the clip's start, inside the padding, and a joined window's first word of a piece up to a few
    hundred ms late). Only a word within ``ONSET_SNAP_SECONDS`` of the onset is moved: a word far
    from it is not the one the onset belongs to (the recogniser missed that one). ``claimed``: the
    spans (indices into ``speech``) whose first word was seen, across the segments of one call."""
    onsets = [s.start for s in speech]
    out = []
    for w in words:
        i = bisect.bisect_right(onsets, w.start + PAD_SECONDS + 0.01) - 1  # the span this word opens or sits in
        if i >= 0 and i not in claimed and abs(w.start - onsets[i]) <= ONSET_SNAP_SECONDS:
            claimed.add(i)
            w = w.model_copy(update={"start": onsets[i], "end": max(w.end, onsets[i])})
        elif i >= 0:
            claimed.add(i)
        out.append(w)
    return out


def _settle(
    job: LiveJob,
    vad: StreamingSilero,
    audio: AudioBuffer,
    arrivals: Arrivals,
    *,
    ended: bool,
    duration: float = 0.0,
) -> Iterator[dict[str, str]]:
    """Take the cues now final, write the windows no later cue can reach, publish, checkpoint."""
    clock, cues = job.clock, job.cues
    heard = clock.time_at(vad.fed)
    if ended:
        fresh = cues.take_rest()
        final_until = duration
    else:
        pending = cues.pending
        open_start = vad.open_start
        silent_since = clock.time_at(open_start) if open_start is not None else heard
        if job.backlog:  # spans waiting to be recognised: their words come before anything later
            silent_since = min(silent_since, clock.time_at(job.backlog[0][0]))
        pause = job.request.rules.sentence_pause_seconds
        if pending and open_start is None and not job.backlog and heard - pending[-1].end >= pause:
            fresh = cues.take_rest()  # the pause that closes their stretch is here: no later word joins it
        else:
            fresh = cues.take_final()
        bound = min(heard, silent_since) - LOOKBACK_SECONDS
        final_until = min(cues.final_until(bound), bound)
        if open_start is None and not job.backlog:
            audio.drop_before(vad.fed - round(LOOKBACK_SECONDS * SAMPLE_RATE))
    final_until = max(final_until, job.final_until)
    job.final_until = final_until
    # Cue time 0 is the stream's origin PTS, plus every jump absorbed before these segments.
    job.chunks.timestamp_map = f"X-TIMESTAMP-MAP=MPEGTS:{clock.mpegts(0.0)},LOCAL:00:00:00.000"
    if ended:
        segments = job.chunks.add(fresh, final_until=final_until) + job.chunks.close(duration)
    else:
        segments = job.chunks.add(fresh, final_until=final_until)
    if not segments and not ended:
        return
    ctx = job.ctx
    for name, text in segments:
        ctx.artifacts.write_text(f"{CHUNKS}/{name}", text)
    ctx.artifacts.write_text(PLAYLIST, job.playlist(ended=ended))
    # With an object store: the segments there first, then the playlist that lists them, where
    # readers on other hosts find it (a reader never holds a playlist naming a segment it cannot get).
    ctx.store_now([f"{CHUNKS}/{name}" for name, _ in segments])
    playlist_url = ctx.share_live(PLAYLIST)
    published_at = time.time()
    _measure(job, arrivals, published_at)
    if not ended:
        # Before the announcement: a segment a client was told of is in the checkpoint, so an
        # attempt that takes over never writes that segment again, differently.
        ctx.checkpoint(job.final_until, job.state(), job.files())
    for name, _ in segments:
        yield {"segment": f"{CHUNKS}/{name}", **({"playlist": playlist_url} if playlist_url else {})}


def _measure(job: LiveJob, arrivals: Arrivals, published_at: float) -> None:
    """Latency of each cue now in a written segment for the first time."""
    written_until = job.chunks.segment_count * job.request.chunk_seconds
    for cue in job.cues.all:
        key = cue_key(cue)
        if key in job.published or cue.start >= written_until:
            continue
        job.published.add(key)
        utterance_end = min(cue.end, _speech_end(job.speech, cue.end))
        arrived = arrivals.wall_of(utterance_end)
        if arrived is not None:
            job.latencies.append(round(max(0.0, published_at - arrived), 3))


def _speech_end(speech: Sequence[Span], at: float) -> float:
    """End of the speech span reaching ``at`` (the cue's end may be stretched past the words)."""
    starts = [s.start for s in speech]
    i = bisect.bisect_left(starts, at) - 1
    return speech[i].end if i >= 0 else at


def _finish(ctx: EngineContext, job: LiveJob, end_reason: str, duration: float) -> LiveSubtitleResult:
    request, cues = job.request, job.cues.all
    base = timing_report(cues, job.speech, duration, request.rules, words_in_silence=job.silent_words)
    latencies = np.asarray(job.latencies) * 1000.0
    timing = LiveTimingReport(
        **base.model_dump(), origin_pts=job.clock.origin,
        discontinuities=[d.model_dump() for d in job.clock.discontinuities],
        drift_ms_max=round(job.clock.drift_max * 1000.0, 1), gaps=job.gaps,
        latency_ms_p50=round(float(np.percentile(latencies, 50)), 1) if latencies.size else None,
        latency_ms_p95=round(float(np.percentile(latencies, 95)), 1) if latencies.size else None,
        latency_ms_max=round(float(latencies.max()), 1) if latencies.size else None, latencies=int(latencies.size),
    )  # fmt: skip
    language = job.language or "und"
    files = {"json": JSON_NAME}
    canonical = {
        "stream": request.stream, "end_reason": end_reason, "language": language, "model": job.model or "none",
        "rung": ctx.rung, "variant": ctx.rung,  # variant: the release before's name, written for one release
        "duration": round(duration, 3), "speech": [[s.start, s.end] for s in job.speech],
        "rules": request.rules.model_dump(mode="json"), "cues": [c.model_dump(mode="json") for c in cues],
        "timing": timing.model_dump(mode="json"),
    }  # fmt: skip
    ctx.artifacts.write_text(JSON_NAME, json.dumps(canonical, indent=1) + "\n")
    if "vtt" in request.formats:
        ctx.artifacts.write_text(VTT_NAME, to_webvtt(cues))
        files["vtt"] = VTT_NAME
    if "srt" in request.formats:
        ctx.artifacts.write_text(SRT_NAME, to_srt(cues))
        files["srt"] = SRT_NAME
    return LiveSubtitleResult(
        stream=request.stream, end_reason=end_reason, language=language, model=job.model or "none",
        duration=round(duration, 3), speech_seconds=round(sum(s.end - s.start for s in job.speech), 3),
        spans=len(job.speech), words=job.words, cues=len(cues), speech=[(s.start, s.end) for s in job.speech],
        rules=request.rules, timing=timing, files=files, playlist=PLAYLIST, attempts=job.attempts,
    )  # fmt: skip
