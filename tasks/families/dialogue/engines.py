"""The assembly of a dialogue: every line's audio, in script order, into one track with subtitles.

It runs as the fan-in job of the dialogue's pipeline, once every line's TTS job has ended:

1. The plan and each line job's result envelope are read by id, in script order
   (``ctx.collect``), whatever order the lines finished in.
2. Each line's result must be in the script's speaker's voice (a line job's result names its
   speaker); its WAV is read back against the sha256 its job recorded.
3. Lines go into the encoder one at a time, resampled to the track's rate where theirs differs,
   with ``pause`` seconds of silence between two; the samples written say where each line is.
4. Cues: each sentence's times from the line's synthesis, offset by the line's place. Written as
   ``dialogue.vtt``, ``dialogue.srt`` and ``dialogue.json`` (the result itself).

Memory holds one line's audio at a time, whatever the dialogue's length.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from mediafarm.tasks.families.dialogue.spec import (
    AssembleParams,
    DialogueLineResult,
    DialogueRequest,
    DialogueResult,
    LineAttempt,
)
from mediafarm.tasks.families.dialogue.subtitles import Cue, to_srt, to_webvtt
from mediafarm.tasks.families.dialogue.track import read_line_audio, resample
from mediafarm.tasks.families.tts.audio import EXTENSION, Encoder
from mediafarm.tasks.families.tts.spec import SentenceTiming, TtsResult
from mediafarm.tasks.kit import Collected, EngineContext, PermanentFailure

SUBTITLES = ("dialogue.vtt", "dialogue.srt", "dialogue.json")


def _line(collected: Collected) -> tuple[TtsResult, dict[str, Any]]:
    """The line job's result, checked against the script: the same speaker, a WAV it listed."""
    part, envelope = collected.part, collected.envelope
    result = TtsResult.model_validate(envelope["output"])
    if result.speaker != part.fields.get("speaker"):
        raise PermanentFailure(
            f"{part.label} ({part.job_id}) was voiced as speaker {result.speaker!r}, but the script says "
            f"{part.fields.get('speaker')!r}: refusing to put it in the track"
        )
    if result.format != "wav":
        raise PermanentFailure(f"{part.label} ({part.job_id}) made {result.format}, not the WAV a dialogue line needs")
    return result, envelope


def assemble(ctx: EngineContext, request: DialogueRequest, params: AssembleParams) -> DialogueResult:
    """The pipeline of the module docstring."""
    waiting = ctx.part(0.0, 0.0)  # waiting reports a stage, not a fraction of the work
    collected = ctx.collect(timeout=params.wait_s,
                            on_wait=lambda part: waiting.progress(0.0, stage=f"waiting for {part.label}"))  # fmt: skip
    lines = [(c, *_line(c)) for c in collected]
    rate = max(result.sample_rate for _, result, _ in lines)
    pause = np.zeros(int(round(request.pause * rate)), dtype=np.float32)
    name = f"dialogue.{EXTENSION[request.format]}"
    placed: list[DialogueLineResult] = []
    cues: list[Cue] = []
    position = 0  # samples written, at the track's rate
    with ctx.artifacts.writing(name) as temp, Encoder(temp, request.format, rate) as encoder:
        for number, (collected, result, envelope) in enumerate(lines, 1):
            ctx.check_cancelled()
            part = collected.part
            sha = next((a["sha256"] for a in envelope.get("artifacts", []) if a["name"] == result.audio), None)
            path = ctx.artifact_path_of(part.job_id, result.audio)  # from the store if it ran elsewhere
            samples, line_rate = read_line_audio(path, sha, f"{part.label} ({part.job_id})")
            samples = resample(samples, line_rate, rate)
            if number > 1 and pause.size:
                encoder.write(pause)
                position += pause.size
            offset = position / rate
            encoder.write(samples)
            position += samples.size
            sentences = [SentenceTiming(text=s.text, start=round(offset + s.start, 3), end=round(offset + s.end, 3))
                         for s in result.sentences]  # fmt: skip
            cues += [Cue(s.start, s.end, result.speaker, s.text, number) for s in sentences]
            placed.append(DialogueLineResult(
                index=number, speaker=result.speaker, text=part.fields["text"], start=sentences[0].start,
                end=sentences[-1].end, sentences=sentences, job_id=part.job_id, rung=result.rung,
                voice=result.voice, sample_rate=line_rate, resampled=line_rate != rate,
                attempts=[LineAttempt(rung=a["rung"], variant=a["rung"], outcome=a.get("outcome"),
                                      reason=a.get("reason", "")) for a in envelope.get("attempts", [])],
            ))  # fmt: skip
            ctx.progress(number / len(lines), stage=f"line {number}/{len(lines)}", media_seconds=position / rate)
    result = DialogueResult(
        audio=name, format=request.format, sample_rate=encoder.rate, duration=round(position / rate, 3),
        pause=request.pause, lines=placed, cues=len(cues), subtitles=list(SUBTITLES),
    )  # fmt: skip
    for artifact, text in (("dialogue.vtt", to_webvtt(cues)), ("dialogue.srt", to_srt(cues)),
                           ("dialogue.json", json.dumps(result.model_dump(mode="json"), indent=1))):  # fmt: skip
        with ctx.artifacts.writing(artifact) as temp:
            temp.write_text(text, encoding="utf-8")
    return result
