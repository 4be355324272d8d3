"""TTS engines: ChatTTS, Piper and espeak-ng, all through one streaming pipeline (:func:`speak`).

1. The job's speaker is read from the speaker store on the farm's Redis (``ctx.redis``; a name no
   one registered is bad input).
2. The text is cut into chunks at sentence boundaries, each small enough for one engine call.
3. Chunk after chunk, in order: the engine speaks its pieces, the joiner places them in the
   track (short fades, silences between sentences), the samples go to the encoder of the final
   file, and the chunk is written on its own as ``chunks/chunk_NNNNN.wav`` (exactly the track's
   samples from its start to its end) and announced as a partial output with its sentence times,
   so a client can play it before the job ends.
   A long text keeps a checkpoint now and then after a chunk (``tts.checkpoints``): a lost
   attempt's next one on the same rung goes on from the chunk after it (``tts.resume``).
4. The result: the audio artifact, its duration, every sentence's start and end, the rung and voice.

Memory stays flat with the text's length: one chunk's audio is held at a time.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, Protocol

import numpy as np

from mediafarm.tasks.families.tts.audio import EXTENSION, Encoder, Joiner, encode, pcm16
from mediafarm.tasks.families.tts.checkpoints import ChunkCheckpoints, chunk_name
from mediafarm.tasks.families.tts.languages import espeak_voice_for, request_language
from mediafarm.tasks.families.tts.speakers import DEFAULT, Speaker, get_speaker
from mediafarm.tasks.families.tts.spec import (
    ChatTTSParams,
    EspeakParams,
    PiperParams,
    SentenceTiming,
    TtsRequest,
    TtsResult,
)
from mediafarm.tasks.families.tts.text import plan_chunks
from mediafarm.tasks.kit import EngineContext, PermanentFailure


class Voice(Protocol):
    """What the pipeline needs of an engine: its sample rate, a label, and speech for texts."""

    rate: int
    label: str

    def speak(self, texts: Sequence[str]) -> list[np.ndarray]:
        """One waveform (float32 mono at ``rate``) per text, in order."""
        ...


def _speaker(ctx: EngineContext, request: TtsRequest) -> Speaker:
    """The job's speaker as it speaks the job's language (its voices for that language)."""
    if ctx.redis is None and request.speaker != DEFAULT:
        # A local call given no Redis: never a connection of its own to whatever FARM_* names.
        raise PermanentFailure(
            f"speaker {request.speaker!r}: this engine context has no Redis to read the speaker store from "
            "(EngineContext.local(redis=...)); without one only the built-in 'default' speaks"
        )
    return get_speaker(request.speaker, ctx.redis).for_language(request_language(request))


def chattts(ctx: EngineContext, request: TtsRequest, params: ChatTTSParams) -> Generator[Any, None, TtsResult]:
    """ChatTTS from the models dir on the rung's device; the speaker's embedding, or its seed's."""
    from mediafarm.tasks.families.tts.chattts import ChatTTSVoice, embedding_from_seed, load_chattts

    speaker = _speaker(ctx, request)
    model = load_chattts(ctx.model_path(params.model), ctx.device)
    embedding = speaker.embedding or embedding_from_seed(model, speaker.chattts_seed)
    voice = ChatTTSVoice(
        model, embedding, speed=request.speed, max_new_token=params.max_new_token,
        temperature=params.temperature, language=request_language(request),
    )  # fmt: skip
    voice.label += f" seed {speaker.chattts_seed}" if speaker.embedding is None else " (stored embedding)"
    return (yield from speak(ctx, request, voice, params.max_chars))


def piper(ctx: EngineContext, request: TtsRequest, params: PiperParams) -> Generator[Any, None, TtsResult]:
    """Piper on the CPU: the speaker's voice file (or the rung's), its speaker id, or its pitch."""
    from mediafarm.tasks.families.tts.piper import PiperTTSVoice

    speaker = _speaker(ctx, request)
    model = ctx.model_path(speaker.piper_voice or params.voice)
    voice = PiperTTSVoice(
        model, speaker_id=speaker.piper_speaker, speed=request.speed, pitch=speaker.piper_pitch,
        noise_scale=params.noise_scale, noise_w_scale=params.noise_w_scale, threads=params.threads,
    )  # fmt: skip
    return (yield from speak(ctx, request, voice, params.max_chars))


def espeak(ctx: EngineContext, request: TtsRequest, params: EspeakParams) -> Generator[Any, None, TtsResult]:
    """espeak-ng: the speaker's voice for the job's language, or its slot's variant of espeak-ng's
    voice for that language (``cmn`` for Chinese: it reads the Latin words of a mixed text as English)."""
    from mediafarm.tasks.families.tts.espeak import EspeakVoice

    speaker = _speaker(ctx, request)
    name = speaker.espeak
    language = request_language(request)
    if speaker.espeak_voice is None and language not in (None, "en"):
        # The language check let this rung run: espeak-ng lists a voice for it.
        base = espeak_voice_for(params.binary, language) or language
        name = base + name[name.index("+") :] if "+" in name else base
    return (yield from speak(ctx, request, EspeakVoice(params.binary, name, request.speed), params.max_chars))


def speak(ctx: EngineContext, request: TtsRequest, voice: Voice, max_chars: int) -> Generator[Any, None, TtsResult]:
    """The pipeline of the module docstring; yields one partial output per chunk."""
    plan = plan_chunks(request.text, max_chars)
    total_chars = sum(c.chars for c in plan.chunks)
    # The chunk in which each sentence's last piece is spoken: its times are final from there on.
    last_chunk = {piece.sentence: chunk.index for chunk in plan.chunks for piece in chunk.pieces}
    name = f"speech.{EXTENSION[request.format]}"
    rate = voice.rate
    joiner = Joiner(rate, speed=request.speed)
    spans: dict[int, list[int]] = {}  # sentence -> [start, end] in samples
    checkpoints = ChunkCheckpoints(ctx, plan, voice.label, rate, max_chars, len(request.text))
    start = checkpoints.start(joiner, spans)  # 0, or where the checkpoint resumed from left off

    def announce(index: int, first: int, end: int) -> dict[str, Any]:
        ended = sorted(s for s in {p.sentence for p in plan.chunks[index].pieces} if last_chunk[s] == index)
        return {
            "chunk": index, "artifact": chunk_name(index), "start": _s(first, rate), "end": _s(end, rate),
            "sentences": [{"index": i, **_timing(plan.sentences[i], spans[i], rate)} for i in ended],
        }  # fmt: skip

    # The encoder is flushed only when every chunk was spoken, closed on every path; the file
    # is renamed into place only then (ArtifactStore.writing).
    with ctx.artifacts.writing(name) as temp, Encoder(temp, request.format, rate) as encoder:
        # Resumed: the kept chunks go into the new file first, and are announced again (this
        # attempt's partial outputs are the whole track's, as a client following it expects).
        for index, first, pcm in checkpoints.replay(start):
            encoder.write(pcm)
            yield announce(index, first, first + pcm.size)
        done_chars = sum(c.chars for c in plan.chunks[:start])
        if start:
            ctx.progress(done_chars / total_chars, stage="synthesise", media_seconds=joiner.samples / rate)
        for chunk in plan.chunks[start:]:
            ctx.check_cancelled()
            audios = voice.speak([p.text for p in chunk.pieces])
            first = joiner.samples
            samples, placed = joiner.join([p.sentence for p in chunk.pieces], audios)
            # 16-bit PCM, the chunk file's exact samples, into the file too: a resumed attempt
            # feeds it the kept chunk files, and its audio is then this one's.
            pcm = pcm16(samples)
            encoder.write(pcm)
            # Not synced on its own: the final file supersedes it, and a checkpoint that keeps it syncs it.
            with ctx.artifacts.writing(chunk_name(chunk.index), durable=False) as chunk_path:
                encode(chunk_path, "wav", rate, pcm)
            for piece in placed:
                spans.setdefault(piece.sentence, [piece.start, piece.end])[1] = piece.end
            done_chars += chunk.chars
            # In the round trip of the chunk's partial output, yielded next: one a chunk, not two.
            ctx.progress(done_chars / total_chars, stage="synthesise", media_seconds=joiner.samples / rate,
                         with_next_output=True)  # fmt: skip
            checkpoints.after(chunk.index, joiner, spans)
            yield announce(chunk.index, first, joiner.samples)
    return TtsResult(
        audio=name, format=request.format, duration=_s(joiner.samples, rate), sample_rate=encoder.rate,
        sentences=[SentenceTiming(**_timing(text, spans[i], rate)) for i, text in enumerate(plan.sentences)],
        chunks=len(plan.chunks), speaker=request.speaker, rung=ctx.rung, voice=voice.label,
        language=request_language(request),
    )  # fmt: skip


def _s(samples: int, rate: int) -> float:
    return round(samples / rate, 3)


def _timing(text: str, span: list[int], rate: int) -> dict[str, Any]:
    return {"text": text, "start": _s(span[0], rate), "end": _s(span[1], rate)}
