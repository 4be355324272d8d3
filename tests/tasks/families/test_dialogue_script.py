"""The dialogue family without a worker: scripts checked at submit, the plan, cues, resampling.

Submits here reach the session's Redis (speakers are looked up) but no worker: a bad script must be
refused before anything is sent.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import numpy as np
import pytest
import srt
import webvtt

from mediafarm import InvalidRequest, register_speaker, remove_speaker, submit
from mediafarm.config.priorities import redis_lists
from mediafarm.tasks import registry
from mediafarm.tasks.app import app
from mediafarm.tasks.families.dialogue.script import MAX_LINE_CHARS, MAX_LINES
from mediafarm.tasks.families.dialogue.spec import DialogueRequest
from mediafarm.tasks.families.dialogue.subtitles import Cue, to_srt, to_webvtt
from mediafarm.tasks.families.dialogue.track import resample
from mediafarm.tasks.producer.client import send_plan
from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.errors import PermanentFailure
from mediafarm.tasks.wire.plan import Part, Plan, collect

QUEUE = f"dialogue-unit-{uuid.uuid4().hex[:6]}"  # no worker consumes it: what is sent stays there


def queued() -> int:
    return int(app.backend.client.llen(QUEUE))


@pytest.fixture(scope="module")
def speaker():
    name = f"sam-{uuid.uuid4().hex[:6]}"
    register_speaker(name)
    yield name
    remove_speaker(name)


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ([], "script: has no lines"),
        ({"lines": []}, "script: has no lines"),
        ({"line": []}, r"unknown key\(s\) \['line'\]"),
        (42, "must be a list of lines"),
        ([{"speaker": "default", "text": "Hi."}, {"speaker": "default", "text": "  \n"}],
         "script: line 2: text: .*empty or only whitespace"),
        ([{"speaker": "default", "text": "Hi."}] * 2 + [{"speaker": "default", "text": "Hi.", "voice": "x"}],
         "script: line 3: voice: Extra inputs are not permitted"),
        ([{"speaker": "default"}], "script: line 1: text: Field required"),
        ([{"speaker": "default", "text": "a\x00b"}], r"line 1: text: .*U\+0000 at character 1"),
        ([{"speaker": "default", "text": "x" * (MAX_LINE_CHARS + 1)}], "line 1: text: .*at most 2,000"),
        (["Hello."], "line 1: must be an object with speaker and text, got str"),
        ([{"speaker": "default", "text": "Hi."}] * (MAX_LINES + 1), "has 501 lines; a dialogue holds at most 500"),
        ([{"speaker": "default", "text": "Hi."}, {"speaker": "nobody-at-all", "text": "Hi."}],
         "script: line 2: speaker: no speaker named 'nobody-at-all'"),
    ],
)  # fmt: skip
def test_a_bad_script_is_refused_at_submit_naming_its_line(script, message) -> None:
    job_id = f"dlg-{uuid.uuid4().hex[:8]}"
    with pytest.raises(InvalidRequest, match=message):
        submit("dialogue", script=script, queue=QUEUE, job_id=job_id)
    assert queued() == 0 and not app.backend.client.exists(keys.pipeline_plan(job_id))
    assert not app.backend.client.exists(keys.submitted(job_id))  # the id is free again


def test_a_script_file_is_read_by_the_producer(tmp_path: Path, speaker: str) -> None:
    script = tmp_path / "script.json"
    lines = [{"speaker": speaker, "text": "One."}, {"speaker": "default", "text": "Two."}]
    script.write_text(json.dumps({"lines": lines}))
    request = registry.get("dialogue").parse_request({"script": str(script)})
    assert [(line.speaker, line.text) for line in request.script] == [(speaker, "One."), ("default", "Two.")]
    script.write_text('{"lines": [')
    with pytest.raises(InvalidRequest, match=r"script file .* is not JSON: .* line 1 column 12"):
        registry.get("dialogue").parse_request({"script": str(script)})
    with pytest.raises(InvalidRequest, match="cannot read the script file .*missing.json: No such file"):
        registry.get("dialogue").parse_request({"script": str(tmp_path / "missing.json")})


def test_the_plan_is_a_tts_job_per_line_then_the_assembly(speaker: str) -> None:
    request = DialogueRequest(script=[{"speaker": speaker, "text": "Hi."}, {"speaker": "default", "text": "Yo."}],
                              pause=0.25, format="mp3", speed=1.5, language="en")  # fmt: skip
    plan = request.as_pipeline("d1")
    assert [p.job_id for p in plan.parts] == ["d1.line-0001", "d1.line-0002"]
    assert [p.label for p in plan.parts] == [f"line 1 ({speaker})", "line 2 (default)"]
    assert all(p.family == "tts" for p in plan.parts)
    assert dict(plan.parts[0].fields) == {"text": "Hi.", "speaker": speaker, "format": "wav", "speed": 1.5,
                                          "language": "en"}  # fmt: skip
    # The assembly carries no script (every line message holds a copy of its signature).
    assert (plan.then.family, plan.then.job_id, dict(plan.then.fields)) == (
        "dialogue",
        "d1",
        {"pause": 0.25, "format": "mp3"},
    )
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_the_worker_refuses_a_script_and_a_missing_plan() -> None:
    spec = registry.get("dialogue")
    with pytest.raises(InvalidRequest, match="farm.dialogue.assemble takes no script"):
        spec.parse_request({"script": "/etc/passwd"}, media_roots=[Path("/")])
    assert spec.parse_request({"pause": 1.0}, media_roots=[Path("/")]).script is None
    with pytest.raises(PermanentFailure, match="no pipeline plan is stored for job nothing-here"):
        collect(app.backend, "nothing-here", timeout=0)


def test_send_plan_checks_every_part_before_sending_anything() -> None:
    then = Part("dialogue", f"d-{uuid.uuid4().hex[:6]}", {}, "assembly")
    good = Part("tts", then.job_id + ".line-0001", {"text": "Fine.", "format": "wav"}, "line 1 (default)")
    bad = Part("tts", then.job_id + ".line-0002", {"text": "Fine.", "speed": 9}, "line 2 (default)")
    with pytest.raises(InvalidRequest, match=r"line 2 \(default\): tts request: speed: .*less than or equal to 2"):
        send_plan(Plan((good, bad), then), queue=QUEUE)
    with pytest.raises(InvalidRequest, match="share an id"):
        send_plan(Plan((good, good), then), queue=QUEUE)
    assert queued() == 0 and not app.backend.client.exists(keys.pipeline_plan(then.job_id))


def test_cues_write_voice_tagged_webvtt_and_prefixed_srt_that_parse_back() -> None:
    cues = [Cue(0.0, 1.2344, "alice", "Fish & chips <now>?", 1), Cue(1.9, 3.5, "bob.b", "Yes -> please.", 2)]
    vtt = webvtt.from_string(to_webvtt(cues))
    assert [(c.voice, c.text, c.start, c.end) for c in vtt.captions] == [
        ("alice", "Fish &amp; chips &lt;now&gt;?", "00:00:00.000", "00:00:01.234"),
        ("bob.b", "Yes -&gt; please.", "00:00:01.900", "00:00:03.500"),
    ]
    subs = list(srt.parse(to_srt(cues)))
    assert [(s.index, s.content, s.start.total_seconds(), s.end.total_seconds()) for s in subs] == [
        (1, "alice: Fish & chips <now>?", 0.0, 1.234), (2, "bob.b: Yes -> please.", 1.9, 3.5)]  # fmt: skip


@pytest.mark.parametrize(("rate", "to"), [(24000, 22050), (22050, 24000), (16000, 48000)])
def test_resampling_keeps_duration_pitch_and_timing(rate: int, to: int) -> None:
    t = np.arange(int(1.5 * rate)) / rate
    tone = (0.5 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)
    tone[int(0.7 * rate)] = 1.0  # a click at 0.7 s
    out = resample(tone, rate, to)
    assert out.dtype == np.float32 and out.size == int(round(tone.size * to / rate))
    spectrum = np.abs(np.fft.rfft(out * np.hanning(out.size)))
    assert np.fft.rfftfreq(out.size, 1 / to)[np.argmax(spectrum)] == pytest.approx(440.0, abs=1.0)
    residue = out - 0.5 * np.sin(2 * np.pi * 440.0 * np.arange(out.size) / to)
    assert np.argmax(np.abs(residue[int(0.1 * to) : int(1.4 * to)])) / to + 0.1 == pytest.approx(0.7, abs=0.001)
    assert resample(tone, rate, rate) is tone


def test_the_chord_counts_each_part_once_and_dispatches_the_fan_in_once() -> None:
    # What a line's retry or a redelivered line leans on (Celery 5.7's Redis backend): a part that
    # reports its final state twice counts once, and a report after the dispatch sends nothing.
    from types import SimpleNamespace

    group_id, queue = f"g-{uuid.uuid4().hex[:8]}", f"fan-in-{uuid.uuid4().hex[:6]}"
    body = app.signature("farm.dialogue.assemble", kwargs={}, task_id=f"{group_id}-body", queue=queue, immutable=True)
    app.backend.set_chord_size(group_id, 2)

    def done(part: str, index: int) -> None:
        request = SimpleNamespace(id=part, group=group_id, group_index=index, chord=dict(body))
        app.backend.on_chord_part_return(request, "SUCCESS", {"part": part})

    def queued() -> int:  # the fan-in's message, in whichever of the queue's priority lists
        return sum(app.backend.client.llen(name) for name in redis_lists(queue))

    done("a", 0)
    done("a", 0)  # the same part again (a worker lost after storing SUCCESS, say)
    assert queued() == 0
    done("b", 1)
    assert queued() == 1
    done("b", 1)
    assert queued() == 1
