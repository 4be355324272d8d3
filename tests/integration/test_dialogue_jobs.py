"""Dialogue jobs on a real worker: lines as TTS jobs in one chord, assembled in order, on real audio.

The worker serves one queue of its own (the lines and the assembly both go there) with a test TTS
ladder: ``espeak`` first (fast; its binary is a gate script that holds espeak-ng for a few seconds
when a line says "Patience", a window to SIGKILL that line's child), then ``piper`` (the real joe
voice). So a killed line comes back on ``piper`` while the others are espeak-ng's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import srt
import webvtt

from mediafarm import JobRejected, register_speaker, remove_speaker, submit
from mediafarm.config.settings import get_settings
from mediafarm.tasks.app import app
from mediafarm.tasks.families.dialogue.script import line_job_id
from mediafarm.tasks.families.dialogue.spec import DialogueRequest
from mediafarm.tasks.producer.client import JobHandle, send_plan
from mediafarm.tasks.producer.handles import PipelineHandle
from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.plan import Part, Plan
from tests.conftest import REPO
from tests.support.kills import kill_running
from tests.support.piper_voice import link_joe_voice
from tests.support.speech import held_espeak
from tests.support.voices import speech_spans, voice_distance

pytestmark = pytest.mark.integration
QUEUE = "dialogue-test"
# espeak-ng held 8 s on a line saying "Patience": the dialogue tests' window to kill a line.
HOLD_S = 8
LADDER = """
[ladders.tts]
rungs = [
  {{ name = "espeak", engine = "espeak", params = {{ binary = "{gate}" }} }},
  {{ name = "piper", engine = "piper" }},
]
"""
# Semitones between two clips' median pitch (tests/support/voices.py) above which they are two
# voices. Measured here on espeak-ng (slots' variants en-us+m3 and en-us+f3): one speaker's lines
# 0.1-0.7 apart (4.1 once, a short line), the two speakers 11.9-13.3 apart.
VOICES_DIFFER = 5.0


@pytest.fixture(scope="module")
def dialogue_worker(start_worker, session_dir: Path):
    link_joe_voice(get_settings().models_dir)
    gate = held_espeak(session_dir / "espeak-gate.sh", HOLD_S)
    config = session_dir / "farm-dialogue-test.toml"
    config.write_text((REPO / "tests" / "support" / "farm-test.toml").read_text() + LADDER.format(gate=gate))
    return start_worker("cpu", concurrency=2, queues=[QUEUE], env={"FARM_CONFIG_FILE": str(config)})


@pytest.fixture(scope="module")
def speakers():
    """Two speakers with no voice of their own: each gets its slot's, distinct on every rung."""
    names = (f"alice-{uuid.uuid4().hex[:6]}", f"bob-{uuid.uuid4().hex[:6]}")
    for name in names:
        register_speaker(name)
    yield names
    for name in names:
        remove_speaker(name)


@pytest.fixture(scope="module")
def vad_model():
    from silero_vad import load_silero_vad

    return load_silero_vad(onnx=True)


def script_of(speakers: tuple[str, str], texts: list[str]) -> list[dict[str, str]]:
    """Lines alternating between the two speakers, the first one first."""
    return [{"speaker": speakers[i % 2], "text": text} for i, text in enumerate(texts)]


TEXTS = ["Good morning, Bob.", "Morning. Did you sleep well?", "Not really. The storm kept me awake.",
         "It was loud here too.", "Shall we have some tea?", "Yes please, with milk."]  # fmt: skip


def at(timestamp: webvtt.models.Timestamp) -> float:
    """A WebVTT time in seconds, to the millisecond."""
    return timestamp.in_milliseconds() / 1000


def fetched(job: JobHandle, folder: Path) -> dict[str, Path]:
    return {a.name: job.download(a.name, folder / a.name) for a in job.artifacts()}


def samples(path: Path) -> tuple[np.ndarray, int]:
    audio, rate = sf.read(path, dtype="int16")
    return audio, rate


def line_audio(line: dict) -> tuple[np.ndarray, int]:
    from mediafarm.tasks.wire.artifacts import ArtifactStore

    return samples(ArtifactStore(get_settings().storage_dir, line["job_id"]).path("speech.wav"))


def slot(track: np.ndarray, rate: int, line: dict) -> np.ndarray:
    """The line job's own audio, found exactly where dialogue.json says the line is in the track
    (its times are rounded to the ms: within 12 samples at 22.05 kHz); AssertionError if it is not."""
    own, own_rate = line_audio(line)
    assert own_rate == rate
    near = int(round(line["start"] * rate))
    found = [s for s in range(max(0, near - 12), near + 13) if np.array_equal(track[s : s + own.size], own)]
    assert found, f"line {line['index']}'s own audio is not at {line['start']} s in the track"
    return track[found[0] : found[0] + own.size]


@pytest.fixture(scope="module")
def first(dialogue_worker, speakers, tmp_path_factory):
    """A 6-line, 2-speaker dialogue followed with progress, then submitted again under its job id."""
    job_id = f"dlg-{uuid.uuid4().hex[:8]}"
    job = submit("dialogue", script={"lines": script_of(speakers, TEXTS)}, pause=0.6, job_id=job_id, queue=QUEUE)
    seen: list = []
    envelope = job.wait(timeout=120, poll=0.02, on_progress=seen.append)
    again = submit("dialogue", script={"lines": script_of(speakers, TEXTS)}, pause=0.6, job_id=job_id, queue=QUEUE)
    files = fetched(job, tmp_path_factory.mktemp("dialogue"))
    return {"job": job, "again": again, "envelope": envelope, "progress": seen, "files": files,
            "json": json.loads(files["dialogue.json"].read_text())}  # fmt: skip


def test_lines_are_assembled_in_script_order_with_voice_tagged_cues(first, speakers) -> None:
    envelope, doc = first["envelope"], first["json"]
    assert isinstance(first["job"], PipelineHandle) and envelope["family"] == "dialogue"
    assert [a["outcome"] for a in envelope["attempts"]] == ["ok"] and envelope["variant"] == "assemble"
    assert set(first["files"]) == {"dialogue.wav", "dialogue.vtt", "dialogue.srt", "dialogue.json"}
    assert doc == envelope["output"]
    lines = doc["lines"]
    assert [(x["index"], x["speaker"], x["text"]) for x in lines] == [
        (i, s["speaker"], s["text"]) for i, s in enumerate(script_of(speakers, TEXTS), 1)]  # fmt: skip
    assert [x["job_id"] for x in lines] == [line_job_id(first["job"].id, i) for i in range(1, 7)]
    assert all(x["rung"] == "espeak" and [a["outcome"] for a in x["attempts"]] == ["ok"] for x in lines)
    # One line after another, a pause of 0.6 s between two (the pause is where the last one ended).
    assert all(b["start"] - a["end"] == pytest.approx(0.6, abs=0.002) for a, b in zip(lines, lines[1:]))
    # Each line's place in the track holds that line job's own audio, sample for sample.
    track, rate = samples(first["files"]["dialogue.wav"])
    assert rate == doc["sample_rate"] == 22050 and track.size / rate == pytest.approx(doc["duration"], abs=0.002)
    for line in lines:
        slot(track, rate, line)
    # WebVTT: one cue per sentence, in order, <v Speaker> as the script says, times as the json's.
    vtt = webvtt.read(first["files"]["dialogue.vtt"])
    sentences = [(x["speaker"], s) for x in lines for s in x["sentences"]]
    assert len(vtt.captions) == doc["cues"] == len(sentences) == 8
    for caption, (speaker, sentence) in zip(vtt.captions, sentences, strict=True):
        assert caption.voice == speaker and caption.text == sentence["text"]
        assert (at(caption.start_time), at(caption.end_time)) == pytest.approx((sentence["start"], sentence["end"]))
        assert "<v " in caption.raw_text
    # SRT: the same cues and milliseconds, the speaker as a prefix.
    subs = list(srt.parse(first["files"]["dialogue.srt"].read_text()))
    assert [s.content for s in subs] == [f"{sp}: {s['text']}" for sp, s in sentences]
    assert [s.start.total_seconds() for s in subs] == pytest.approx([s["start"] for _, s in sentences], abs=0.0005)


def test_vad_speech_of_the_track_lines_up_with_the_cues(first, vad_model) -> None:
    vtt = webvtt.read(first["files"]["dialogue.vtt"])
    cues = [(at(c.start_time), at(c.end_time)) for c in vtt.captions]
    speech = speech_spans(first["files"]["dialogue.wav"], vad_model)
    assert speech

    def overlap(a: tuple[float, float], b: tuple[float, float]) -> float:
        return max(0.0, min(a[1], b[1]) - max(a[0], b[0]))

    for cue in cues:  # every cue is mostly speech
        assert sum(overlap(cue, s) for s in speech) >= 0.6 * (cue[1] - cue[0]), (cue, speech)
    # Each speech span belongs to the cue it overlaps most; in track order those cues come in order.
    owners = [max(range(len(cues)), key=lambda i, s=s: overlap(cues[i], s)) for s in speech]
    assert owners == sorted(owners) and set(owners) == set(range(len(cues))), (owners, speech, cues)
    # No speech outside the cues beyond silero's own padding of a span (0.25 s, as for TTS jobs).
    for s in speech:
        assert s[1] - s[0] - sum(overlap(c, s) for c in cues) <= 0.25, (s, cues)


def test_progress_went_through_the_lines_then_the_assembly(first) -> None:
    stages = [p.stage for p in first["progress"]]
    fractions = [p.fraction for p in first["progress"]]
    assert stages[0].startswith("lines ") and stages[0].endswith("/6"), stages
    assert any(s.startswith("assemble") for s in stages), stages
    assert fractions == sorted(fractions) and all(0 <= f <= 1 for f in fractions)


def test_a_second_submit_with_the_same_id_sends_nothing(first) -> None:
    assert isinstance(first["again"], PipelineHandle) and first["again"].id == first["job"].id
    time.sleep(1.0)  # had anything been sent again, the idle worker would have run it by now
    assert first["again"].wait(timeout=5)["output"] == first["envelope"]["output"]
    assert [a["outcome"] for a in first["job"].attempts()] == ["ok"]
    for line in first["json"]["lines"]:
        assert len(JobHandle(line["job_id"], "tts").attempts()) == 1


def test_a_speaker_keeps_its_voice_across_dialogues_and_two_speakers_differ(first, speakers, dialogue_worker,
                                                                            tmp_path: Path) -> None:  # fmt: skip
    # The first line of the first dialogue again, now second in another dialogue.
    script = [{"speaker": speakers[1], "text": "Hello there."}, {"speaker": speakers[0], "text": TEXTS[0]}]
    job = submit("dialogue", script=script, queue=QUEUE)
    job.wait(timeout=90)
    files = fetched(job, tmp_path)
    doc = json.loads(files["dialogue.json"].read_text())
    one, rate = samples(first["files"]["dialogue.wav"])
    two, _ = samples(files["dialogue.wav"])
    alice_1, alice_2 = slot(one, rate, first["json"]["lines"][0]), slot(two, rate, doc["lines"][1])
    assert doc["lines"][1]["start"] > 0.5 and np.array_equal(alice_1, alice_2)  # same samples, other place
    bob = slot(two, rate, doc["lines"][0])
    assert voice_distance(alice_1 / 32768, bob / 32768, rate) > VOICES_DIFFER


def test_one_speakers_lines_are_closer_to_each_other_than_to_the_other_speakers(first) -> None:
    track, rate = samples(first["files"]["dialogue.wav"])
    lines = first["json"]["lines"]
    clips = [slot(track, rate, x) / 32768 for x in lines]
    who = [x["speaker"] for x in lines]
    within, between = [], []
    for i in range(len(lines)):
        for j in range(i + 1, len(lines)):
            (within if who[i] == who[j] else between).append(voice_distance(clips[i], clips[j], rate))
    assert max(within) < VOICES_DIFFER < min(between), (within, between)


def test_a_killed_line_comes_back_on_its_next_rung_in_its_own_place(dialogue_worker, speakers,
                                                                   tmp_path: Path) -> None:  # fmt: skip
    texts = ["The water is boiling.", "Patience, the kettle is nearly ready.", "Then I will get the cups.",
             "Two sugars for me."]  # fmt: skip
    job = submit("dialogue", script=script_of(speakers, texts), queue=QUEUE)
    target = JobHandle(line_job_id(job.id, 2), "tts")
    kill_running(target, "espeak")  # the gate holds line 2's espeak-ng for 8 s
    envelope = job.wait(timeout=120)
    lines = envelope["output"]["lines"]
    killed = lines[1]
    assert killed["job_id"] == target.id and killed["rung"] == "piper" and killed["voice"].startswith("piper ")
    assert [(a["variant"], a["outcome"]) for a in killed["attempts"]] == [("espeak", "killed"), ("piper", "ok")]
    assert [x["rung"] for x in lines] == ["espeak", "piper", "espeak", "espeak"]
    assert [x["text"] for x in lines] == texts and [x["speaker"] for x in lines] == [speakers[i % 2] for i in range(4)]
    # The chord counted line 2 once, on its final SUCCESS: the assembly ran once, after it.
    assembly = envelope["attempts"]
    assert [a["outcome"] for a in assembly] == ["ok"]
    piper_attempt = target.attempts()[-1]
    assert assembly[0]["started"] >= piper_attempt["started"] + piper_attempt["duration"] - 0.01
    files = fetched(job, tmp_path)
    track, rate = samples(files["dialogue.wav"])
    for line in lines:  # piper and espeak-ng both speak at 22.05 kHz: nothing resampled, exact
        assert not line["resampled"]
        slot(track, rate, line)
    vtt = webvtt.read(files["dialogue.vtt"])
    assert [c.voice for c in vtt.captions] == [x["speaker"] for x in lines]
    assert [c.text for c in vtt.captions] == [s["text"] for x in lines for s in x["sentences"]]


def test_a_killed_assembly_runs_again_on_its_own_and_no_line_runs_twice(dialogue_worker, speakers) -> None:
    # The plan stored and its parts sent by hand, the assembly at once (no chord): it waits in
    # ctx.collect for line 1, which the gate holds, long enough to SIGKILL its child.
    dialogue_id = f"dlg-kill-{uuid.uuid4().hex[:8]}"
    plan = DialogueRequest(script=script_of(speakers, ["Patience, please.", "All right."])).as_pipeline(dialogue_id)
    app.backend.client.set(keys.pipeline_plan(dialogue_id), json.dumps(plan.to_json()), ex=3600)
    for part in plan.parts:
        app.send_task("farm.tts.synthesize", kwargs=dict(part.fields), task_id=part.job_id, queue=QUEUE)
    app.send_task("farm.dialogue.assemble", kwargs=dict(plan.then.fields), task_id=dialogue_id, queue=QUEUE)
    assembly = JobHandle(dialogue_id, "dialogue")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        progress = assembly.progress()
        running = [a for a in assembly.attempts() if a["outcome"] is None]
        if running and progress is not None and progress.stage.startswith("waiting for line 1"):
            os.kill(running[0]["pid"], signal.SIGKILL)
            break
        time.sleep(0.05)
    else:
        pytest.fail("the assembly never waited for line 1")
    envelope = assembly.wait(timeout=60)
    assert [(a["variant"], a["outcome"]) for a in envelope["attempts"]] == [
        ("assemble", "killed"),
        ("assemble-again", "ok"),
    ]
    assert [x["rung"] for x in envelope["output"]["lines"]] == ["espeak", "espeak"]
    for part in plan.parts:  # the lines ran once each: only the assembly ran again
        assert [a["outcome"] for a in JobHandle(part.job_id, "tts").attempts()] == ["ok"]


def test_a_line_that_fails_in_the_worker_fails_the_dialogue_naming_it(dialogue_worker, speakers) -> None:
    # Sent as a foreign producer would, past submit's speaker check: line 2's speaker does not exist.
    dialogue_id = f"dlg-bad-{uuid.uuid4().hex[:8]}"
    lines = [(speakers[0], "Hello."), ("nobody-here", "Who am I?"), (speakers[1], "Goodbye.")]
    parts = tuple(Part("tts", line_job_id(dialogue_id, n), {"text": t, "speaker": s, "format": "wav"},
                       label=f"line {n} ({s})") for n, (s, t) in enumerate(lines, 1))  # fmt: skip
    job = send_plan(Plan(parts, Part("dialogue", dialogue_id, {}, "assembly"), "lines", "assemble"), queue=QUEUE)
    started = time.monotonic()
    with pytest.raises(JobRejected, match=r"line 2 \(nobody-here\).*no speaker named 'nobody-here'") as info:
        job.wait(timeout=60)
    assert time.monotonic() - started < 60
    assert info.value.job_id == dialogue_id and [a["outcome"] for a in info.value.attempts] == ["rejected"]
    assert job.state() == "FAILURE" and JobHandle(dialogue_id, "dialogue").attempts() == []  # it never ran
    assert JobHandle(parts[0].job_id, "tts").state() == "SUCCESS"


def test_farm_submit_dialogue_script_json_out_dir_wait(dialogue_worker, speakers, tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"lines": script_of(speakers, ["Ready when you are.", "Let us go."])}))
    out = tmp_path / "out"

    def farm(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "mediafarm.workers.cli", "submit", "dialogue", *args],
                              cwd=tmp_path, env={**os.environ, "COLUMNS": "200"}, capture_output=True, text=True,
                              timeout=120)  # fmt: skip

    done = farm("script.json", "--out", str(out), "--queue", QUEUE, "--pause", "0.3", "--wait")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 lines" in done.stdout and "rung assemble" in done.stdout
    assert {p.name for p in out.iterdir()} == {"dialogue.wav", "dialogue.vtt", "dialogue.srt", "dialogue.json"}
    doc = json.loads((out / "dialogue.json").read_text())
    assert doc["lines"][1]["start"] - doc["lines"][0]["end"] == pytest.approx(0.3, abs=0.002)
    # A bad script is refused before anything is sent, naming its line.
    script.write_text(json.dumps([{"speaker": speakers[0], "text": "Fine."}, {"speaker": speakers[1], "text": " "}]))
    refused = farm("script.json", "--queue", QUEUE)
    assert refused.returncode == 2 and "line 2: text" in refused.stderr.replace("\n", " "), refused.stderr
