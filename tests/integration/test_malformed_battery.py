"""A battery of malformed inputs across every family (issue #18 item 10), one table, one real worker.

Each case makes its input here (files byte by byte or with PyAV, requests as a producer or a plain
Celery client would send them) and says what must happen:

- ``SUBMIT``: ``mediafarm.submit`` raises InvalidRequest naming the problem; nothing is sent.
- ``WORKER``: the job ends JobRejected naming the problem, after exactly one attempt, ``rejected``
  (rungs skipped as unavailable aside); for a pipeline, every stage that failed did so, and the
  fan-in job never ran.
- ``BEFORE_RUNG``: refused by the worker's task before any rung ran (an unknown ladder): JobRejected
  naming the problem, and no attempt at all (for a pipeline: in the stage that failed).
- ``ACCEPTED``: the input is odd but valid (the case's id says why), and the job succeeds.

Every job goes to one worker of this module's own, on the cheapest rung of each family (webrtc for
the VAD, pocketsphinx for subtitles, espeak-ng or else Piper for speech, the motion gate for YOLO),
all sent at once and then waited for. Afterwards the worker's main process is the one that started,
a normal job succeeds on it, and no job was received twice.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from mediafarm import submit
from mediafarm.config.settings import get_settings
from mediafarm.tasks import registry
from mediafarm.tasks.app import app
from mediafarm.tasks.producer.client import JobHandle
from mediafarm.tasks.producer.handles import PipelineHandle
from mediafarm.tasks.wire import keys
from mediafarm.tasks.wire.errors import InvalidRequest, JobFailed, JobRejected
from tests.conftest import REPO
from tests.integration.test_intake import received
from tests.support import malformed as mk
from tests.support.piper_voice import link_joe_voice
from tests.support.yolo import make_audio_only, make_video, truncated

pytestmark = pytest.mark.integration
QUEUE = "malformed-test"
SUBMIT, WORKER, BEFORE_RUNG, ACCEPTED = "at submit", "in the worker", "before a rung", "accepted"
LADDERS = """
[ladders.vad]
rungs = [{ name = "webrtc", engine = "webrtc" }]

[ladders.subtitle]
rungs = [{ name = "pocketsphinx", engine = "pocketsphinx" }]

[ladders.tts]
rungs = [{ name = "espeak", engine = "espeak" }, { name = "piper", engine = "piper" }]

[ladders.yolo]
rungs = [{ name = "motion", engine = "motion", params = { stride_s = 0.5 } }]

[ladders.subtitle-live]
rungs = [{ name = "pocketsphinx", engine = "pocketsphinx" }]
"""


@dataclass(frozen=True)
class Case:
    """One malformed (or odd but valid) input.

    Attributes:
        id: Names the input; ``ok-...`` for a valid one and why it is.
        family: The family it is sent to.
        make: Makes the input in the given folder and returns the request's fields.
        expect: SUBMIT, WORKER, BEFORE_RUNG or ACCEPTED.
        reason: A regex the refusal's reason must match: the problem, named.
        raw: Sent by task name with the plain Celery app, past the producer's check (as a foreign
            client would), so the worker's own check is what refuses it.
        check: For ACCEPTED, what the output must show.
    """

    id: str
    family: str
    make: Callable[[Path], dict[str, Any]]
    expect: str
    reason: str = ""
    raw: bool = False
    check: Callable[[dict[str, Any]], bool] | None = None


def fields(**values: Any) -> Callable[[Path], dict[str, Any]]:
    return lambda folder: dict(values)


def media(name: str, maker: Callable[[Path], Any], **more: Any) -> Callable[[Path], dict[str, Any]]:
    """The file ``name`` made by ``maker(path)`` in the folder, as the request's ``media``."""

    def make(folder: Path) -> dict[str, Any]:
        path = folder / name
        if not path.exists():
            maker(path)
        return {"media": str(path), **more}

    return make


def text_file(path: Path) -> None:
    path.write_text("this is a note, not a recording\n" * 50)


def webvtt_file(path: Path) -> None:
    path.write_text("WEBVTT\n\n00:00.000 --> 00:01.000\nHello.\n")


def cut_video(path: Path) -> None:
    whole = make_video(path.with_name("whole-" + path.name), duration=4.0, audio_seconds=4.0,
                       options={"movflags": "+faststart"})  # fmt: skip
    truncated(whole, path)


def cut_matroska_audio(path: Path) -> None:
    truncated(mk.matroska_audio(path.with_name("whole-" + path.name)), path)


def outside_link(path: Path) -> None:
    outside = path.parent.parent.parent / "outside-battery.wav"
    mk.healthy_wav(outside)
    path.symlink_to(outside)


def odd_name(name: bytes) -> Callable[[Path], dict[str, Any]]:
    """A healthy one-second WAV under a file name that is legal but awkward (bytes: not always UTF-8)."""

    def make(folder: Path) -> dict[str, Any]:
        path = folder / os.fsdecode(name)  # bytes that are not UTF-8 become surrogate escapes, as os.listdir gives them
        path.write_bytes(mk.healthy_wav_bytes())
        return {"media": str(path)}

    return make


def long_path(folder: Path) -> dict[str, Any]:
    return {"media": str(folder / ("deep/" * 900) / "x.wav")}


def long_component(folder: Path) -> dict[str, Any]:
    return {"media": str(folder / ("y" * 300 + ".wav"))}


def script_file(name: str, content: bytes) -> Callable[[Path], dict[str, Any]]:
    def make(folder: Path) -> dict[str, Any]:
        path = folder / name
        path.write_bytes(content)
        return {"script": str(path)}

    return make


def stored_subtitles(content: bytes) -> Callable[[Path], dict[str, Any]]:
    """A 'finished subtitle job' whose subtitles.json is ``content``, in the farm's storage."""

    def make(folder: Path) -> dict[str, Any]:
        source = f"fake-subtitles-{uuid.uuid4().hex[:8]}"
        job = get_settings().storage_dir / source
        job.mkdir(parents=True)
        (job / "subtitles.json").write_bytes(content)
        return {"source": source}

    return make


def lines(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"speaker": s, "text": t} for s, t in pairs]


def about(seconds: float) -> Callable[[dict[str, Any]], bool]:
    return lambda output: abs(output["duration"] - seconds) < 0.05


HI = lines(("default", "Hello there."))
NOT_READ = r"not a media file FFmpeg can read"
CASES: list[Case] = [
    # ---- vad: files
    Case("wav-text-file", "vad", media("notes.wav", text_file), WORKER, NOT_READ + r": notes\.wav"),
    Case("mp3-random-bytes", "vad", media("noise.mp3", lambda p: p.write_bytes(bytes(range(256)) * 64)), WORKER,
         NOT_READ),
    Case("wav-riff-tag-only", "vad", media("riff.wav", lambda p: p.write_bytes(b"RIFF")), WORKER, NOT_READ),
    Case("wav-unknown-codec-tag", "vad", media("codec.wav", partial(mk.write_wav, format_tag=0x1234)), WORKER,
         r"codec\.wav: the audio stream's codec has no decoder"),
    Case("wav-zero-bits-per-sample", "vad", media("bits0.wav", partial(mk.write_wav, bits=0)), WORKER,
         r"bits0\.wav: the audio stream's codec has no decoder"),
    Case("wav-zero-channels", "vad", media("ch0.wav", partial(mk.write_wav, channels=0)), WORKER,
         r"ch0\.wav: the audio stream declares no channels"),
    Case("wav-rate-1-hz", "vad", media("rate1.wav", partial(mk.write_wav, rate=1)), WORKER,
         r"rate1\.wav: .*sample rate of 1 Hz"),
    Case("wav-rate-2-ghz", "vad", media("rate2g.wav", partial(mk.write_wav, rate=2_000_000_000)), WORKER,
         r"sample rate of 2,000,000,000 Hz"),
    Case("wav-rate-0", "vad", media("rate0.wav", partial(mk.write_wav, rate=0)), WORKER, NOT_READ + r": rate0\.wav"),
    Case("wav-fmt-chunk-claims-4gb", "vad", media("fmt4g.wav", partial(mk.with_fmt_size, size=0xFFFFFFF0)), WORKER,
         NOT_READ),
    Case("wav-float-nan-samples", "vad", media("nan.wav", lambda p: mk.float_wav(p, mk.tone() * float("nan"))),
         WORKER, r"nan\.wav: the audio stream has a non-finite sample \(NaN or infinity\) at 0\.000 s"),
    Case("wav-header-claims-4gb-over-1s", "vad", media("claims.wav", partial(mk.write_wav, data_size=4_000_000_000)),
         WORKER, r"claims\.wav: truncated: its WAV header declares 4000000000 bytes .* but the file holds 32000"),
    Case("ok-wav-zero-samples-is-an-empty-recording", "vad", media("empty.wav", partial(mk.write_wav, frames=0)),
         ACCEPTED, check=lambda out: out["duration"] == 0 and out["spans"] == []),
    Case("ok-wav-8mb-unknown-chunk-in-header", "vad", media("junk.wav", partial(mk.with_chunk_before_data,
         size=8 << 20)), ACCEPTED, check=about(1.0)),  # fmt: skip
    Case("mp4-cut-short", "vad", media("cut.mp4", cut_video), WORKER, r"cut\.mp4: truncated: the audio stream ends"),
    Case("video-without-audio", "vad", media("mute.mp4", partial(make_video, duration=2.0)), WORKER,
         r"mute\.mp4 has no audio stream"),
    Case("png-image", "vad", media("still.png", partial(mk.png, width=32, height=24)), WORKER,
         r"still\.png has no audio stream"),
    Case("directory", "vad", lambda folder: {"media": str(folder)}, WORKER, r"not a regular file"),
    Case("path-9000-chars", "vad", long_path, WORKER, r"File name too long"),
    Case("name-300-bytes", "vad", long_component, WORKER, r"File name too long"),
    Case("ok-name-with-spaces", "vad", odd_name(b"a name  with spaces .wav"), ACCEPTED, check=about(1.0)),
    Case("ok-name-unicode", "vad", odd_name("ünïcødé 语音 🎙.wav".encode()), ACCEPTED, check=about(1.0)),
    Case("ok-name-leading-dash", "vad", odd_name(b"-i -y.wav"), ACCEPTED, check=about(1.0)),
    Case("ok-name-with-newline", "vad", odd_name(b"line one\nline two.wav"), ACCEPTED, check=about(1.0)),
    Case("ok-name-255-bytes", "vad", odd_name(b"z" * 251 + b".wav"), ACCEPTED, check=about(1.0)),
    Case("ok-name-not-utf8", "vad", odd_name(b"latin1-\xe9t\xe9.wav"), ACCEPTED, check=about(1.0)),
    Case("ok-name-ffmpeg-protocol-prefix", "vad", odd_name(b"concat:a|b.wav"), ACCEPTED, check=about(1.0)),
    # ---- vad: requests
    Case("media-an-integer", "vad", fields(media=42), SUBMIT, r"media: Value error, must be a non-empty path string"),
    Case("media-with-nul", "vad", fields(media="a\x00b.wav"), SUBMIT, r"media: Value error, contains a NUL byte"),
    Case("if-no-audio-unknown", "vad", fields(media="x.wav", if_no_audio="maybe"), SUBMIT,
         r"if_no_audio: Input should be 'reject' or 'empty'"),
    Case("media-a-list-raw", "vad", fields(media=["a.wav"]), WORKER, r"InvalidRequest: vad request: media", raw=True),
    Case("ladder-unknown", "vad", media("tone.wav", mk.healthy_wav, ladder="nope"), BEFORE_RUNG,
         r"no ladder 'nope' is declared for this family"),
    Case("ladder-of-another-family", "vad", media("tone.wav", mk.healthy_wav, ladder="yolo_motion"), BEFORE_RUNG,
         r"no ladder 'yolo_motion' is declared for this family"),
    # ---- subtitle
    Case("formats-docx", "subtitle", fields(media="x.wav", formats=["docx"]), SUBMIT,
         r"formats\.0: Input should be 'vtt', 'srt' or 'json'"),
    Case("formats-empty", "subtitle", fields(media="x.wav", formats=""), SUBMIT,
         r"formats: List should have at least 1 item"),
    Case("language-not-a-code", "subtitle", fields(media="x.wav", language="English"), SUBMIT, r"language: String"),
    Case("chunk-seconds-1", "subtitle", fields(media="x.wav", chunk_seconds=1), SUBMIT,
         r"chunk_seconds: Input should be greater than or equal to 2"),
    Case("rules-a-string", "subtitle", fields(media="x.wav", rules="tight"), SUBMIT, r"rules: Input should be"),
    Case("rules-min-over-max", "subtitle", fields(media="x.wav", rules={"min_cue_seconds": 5, "max_cue_seconds": 2}),
         SUBMIT, r"min_cue_seconds must not exceed max_cue_seconds"),
    Case("chunk-seconds-text-raw", "subtitle", media("tone.wav", mk.healthy_wav, chunk_seconds="ten"), WORKER,
         r"chunk_seconds: Input should be a valid number", raw=True),
    Case("mka-cut-short", "subtitle", media("cut.mka", cut_matroska_audio), WORKER,
         r"cut\.mka: truncated: the audio stream ends"),
    Case("mka-header-without-packets", "subtitle", media("hollow.mka", partial(mk.header_only, kind="audio")), WORKER,
         r"hollow\.mka ends before its first audio or video packet"),
    Case("symlink-out-of-roots", "subtitle", media("link-out.wav", outside_link), WORKER, r"outside the media roots"),
    Case("video-without-audio", "subtitle", media("mute.mp4", partial(make_video, duration=2.0)), WORKER,
         r"mute\.mp4 has no audio stream"),
    Case("wav-zero-channels", "subtitle", media("ch0.wav", partial(mk.write_wav, channels=0)), WORKER,
         r"declares no channels"),
    # ---- subtitle-live
    Case("stream-not-a-url", "subtitle-live", fields(stream="not a url"), SUBMIT,
         r"stream: .*scheme '\(none\)' is not one the farm reads live"),
    Case("stream-a-local-file", "subtitle-live", fields(stream="file:///etc/passwd"), SUBMIT,
         r"scheme 'file' is not one the farm reads live"),
    Case("stream-ffmpeg-concat", "subtitle-live", fields(stream="concat:udp://127.0.0.1:1|x"), SUBMIT,
         r"scheme 'concat' is not one the farm reads live"),
    Case("stall-timeout-zero", "subtitle-live", fields(stream="udp://127.0.0.1:5000", stall_timeout_s=0), SUBMIT,
         r"stall_timeout_s: Input should be greater than or equal to 1"),
    Case("stream-not-configured", "subtitle-live", fields(stream="udp://10.20.30.40:5000"), WORKER,
         r"live source udp://10\.20\.30\.40:5000 is not configured: add it to FARM_LIVE_SOURCES"),
    # ---- subtitle-render
    Case("source-empty", "subtitle-render", fields(source=""), SUBMIT, r"source: String should have at least 1"),
    Case("source-201-chars", "subtitle-render", fields(source="s" * 201), SUBMIT, r"source: String should have at"),
    Case("formats-json", "subtitle-render", fields(source="abc", formats="json"), SUBMIT,
         r"formats\.0: Input should be 'vtt' or 'srt'"),
    Case("source-no-such-job", "subtitle-render", fields(source="no-such-job"), WORKER,
         r"job 'no-such-job' has no subtitles\.json"),
    Case("source-path-traversal", "subtitle-render", fields(source="../../../etc"), WORKER,
         r"job '\.\./\.\./\.\./etc' has no subtitles\.json"),
    Case("source-json-not-json", "subtitle-render", stored_subtitles(b"\xff\xfe not json"), WORKER,
         r"subtitles\.json cannot be read"),
    Case("source-json-a-list", "subtitle-render", stored_subtitles(b"[1, 2]"), WORKER,
         r"subtitles\.json is not a subtitle job's document"),
    Case("source-json-bad-segment", "subtitle-render", stored_subtitles(b'{"segments": [{"bogus": 1}]}'), WORKER,
         r"subtitles\.json is not a subtitle job's document: segments\.0\.start: Field required"),
    # ---- tts
    Case("text-empty", "tts", fields(text=""), SUBMIT, r"text: Value error, is empty or only whitespace"),
    Case("text-whitespace", "tts", fields(text=" \n\t "), SUBMIT, r"text: Value error, is empty or only whitespace"),
    Case("text-100001-chars", "tts", fields(text="a" * 100_001), SUBMIT, r"is 100,001 characters; the maximum"),
    Case("text-bell", "tts", fields(text="ring \x07 ring"), SUBMIT, r"control character U\+0007 at character 5"),
    Case("text-lone-surrogate-raw", "tts", fields(text="caf\udce9"), WORKER, r"lone surrogate U\+DCE9", raw=True),
    Case("text-a-list", "tts", fields(text=["Hello."]), SUBMIT, r"text: Input should be a valid string"),
    Case("text-punctuation-only", "tts", fields(text="... - ?!"), SUBMIT, r"text: Value error, .*only punctuation"),
    Case("speaker-leading-dash", "tts", fields(text="Hi.", speaker="-rf"), SUBMIT, r"speaker: String should match"),
    Case("speaker-unknown", "tts", fields(text="Hi.", speaker="nobody-registered"), WORKER,
         r"no speaker named 'nobody-registered'"),
    Case("speed-a-word", "tts", fields(text="Hi.", speed="fast"), SUBMIT, r"speed: Input should be a valid number"),
    Case("speed-nan", "tts", fields(text="Hi.", speed=float("nan")), SUBMIT, r"speed: Input should be"),
    Case("speed-1e308", "tts", fields(text="Hi.", speed=1e308), SUBMIT, r"speed: Input should be less than or equal"),
    Case("format-flac", "tts", fields(text="Hi.", format="flac"), SUBMIT, r"format: Input should be 'wav', 'opus'"),
    Case("ok-text-with-markup-characters", "tts", fields(text="Tom & Jerry <speak> 3 > 2."), ACCEPTED,
         check=lambda out: out["duration"] > 0.3),
    # ---- dialogue
    Case("no-script", "dialogue", fields(pause=0.5), SUBMIT, r"a dialogue needs a script"),
    Case("script-empty", "dialogue", fields(script=[]), SUBMIT, r"script: has no lines"),
    Case("script-a-number", "dialogue", fields(script=42), SUBMIT, r"script: must be a list of lines"),
    Case("script-unknown-key", "dialogue", fields(script={"lines": HI, "title": "x"}), SUBMIT,
         r"script: unknown key\(s\) \['title'\]"),
    Case("line-without-text", "dialogue", fields(script=[{"speaker": "default"}]), SUBMIT,
         r"script: line 1: text: Field required"),
    Case("line-a-string", "dialogue", fields(script=["Hello."]), SUBMIT, r"line 1: must be an object .* got str"),
    Case("line-extra-field", "dialogue", fields(script=HI + [{"speaker": "default", "text": "Hi.", "mood": "x"}]),
         SUBMIT, r"line 2: mood: Extra inputs are not permitted"),
    Case("script-501-lines", "dialogue", fields(script=HI * 501), SUBMIT, r"has 501 lines; a dialogue holds at most"),
    Case("line-2001-chars", "dialogue", fields(script=lines(("default", "a" * 2001))), SUBMIT,
         r"line 1: text: .*2,001 characters"),
    Case("line-speaker-unknown", "dialogue", fields(script=HI + lines(("ghost-speaker", "Boo."))), SUBMIT,
         r"line 2: speaker: .*no speaker named 'ghost-speaker'"),
    Case("pause-negative", "dialogue", fields(script=HI, pause=-1), SUBMIT, r"pause: Input should be greater"),
    Case("file-not-json", "dialogue", script_file("script.json", b"{lines: [oops"), SUBMIT, r"is not JSON"),
    Case("file-not-utf8", "dialogue", script_file("latin1.json", b'[{"speaker": "default", "text": "\xe9"}]'), SUBMIT,
         r"is not UTF-8"),
    Case("file-missing", "dialogue", lambda folder: {"script": str(folder / "absent.json")}, SUBMIT,
         r"cannot read the script file .*absent\.json"),
    Case("file-over-4mb", "dialogue", script_file("big.json", b" " * (4 * 1024 * 1024 + 1)), SUBMIT,
         r"big\.json is 4,194,305 bytes; at most"),
    Case("ok-file-with-a-utf8-byte-order-mark", "dialogue",
         script_file("bom.json", b'\xef\xbb\xbf[{"speaker": "default", "text": "Hello there."}]'), ACCEPTED,
         check=lambda out: [line["text"] for line in out["lines"]] == ["Hello there."] and out["duration"] > 0.3),
    Case("assembly-sent-with-a-script-raw", "dialogue", fields(script=HI), WORKER, r"takes no script", raw=True),
    Case("assembly-sent-without-a-plan-raw", "dialogue", fields(), WORKER, r"no pipeline plan is stored", raw=True),
    # ---- yolo
    Case("missing-file", "yolo", lambda folder: {"media": str(folder / "absent.mp4")}, WORKER,
         r"MediaNotFound: media file not found"),
    Case("mp4-cut-short", "yolo", media("cut.mp4", cut_video), WORKER, r"cut\.mp4: truncated: the video stream ends"),
    Case("audio-only", "yolo", media("sound.wav", make_audio_only), WORKER, r"sound\.wav has no video stream"),
    Case("webvtt-named-mp4", "yolo", media("subs.mp4", webvtt_file), WORKER, r"subs\.mp4 has no video stream"),
    Case("png-claims-60000x60000", "yolo", media("huge.png", partial(mk.png, width=60000, height=60000, rows=1)),
         WORKER, r"huge\.png: the video stream declares no frame size"),
    Case("avi-unknown-fourcc", "yolo", media("zzzz.avi", mk.unknown_fourcc_avi), WORKER,
         r"zzzz\.avi: the video stream's codec has no decoder"),
    Case("mkv-header-without-packets", "yolo", media("hollow.mkv", partial(mk.header_only, kind="video")), WORKER,
         r"hollow\.mkv ends before its first audio or video packet: an empty recording, or one cut short"),
    Case("ok-png-1x1", "yolo", media("dot.png", partial(mk.png, width=1, height=1)), ACCEPTED,
         check=lambda out: out["width"] == 1 and out["frames"]["decoded"] == 1),
    Case("ok-timelapse-a-frame-per-10000s", "yolo",
         media("slow.mkv", partial(mk.video, rate=Fraction(1, 10000), frames=3)), ACCEPTED,
         check=lambda out: out["frames"]["decoded"] == 3),
    Case("classes-empty", "yolo", fields(media="x.mp4", classes=[]), SUBMIT, r"classes: List should have at least"),
    Case("class-blank", "yolo", fields(media="x.mp4", classes=["  "]), SUBMIT, r"classes\.0: String should have at"),
    Case("class-65-chars", "yolo", fields(media="x.mp4", classes=["c" * 65]), SUBMIT, r"classes\.0: String should"),
    Case("stride-zero", "yolo", fields(media="x.mp4", stride=0), SUBMIT, r"stride: Input should be greater than 0"),
    Case("stride-61", "yolo", fields(media="x.mp4", stride=61), SUBMIT, r"stride: Input should be less than or"),
    Case("stride-a-word-raw", "yolo", media("tone.wav", mk.healthy_wav, stride="often"), WORKER,
         r"stride: Input should be a valid number", raw=True),
    Case("ladder-a-number-raw", "yolo", media("tone.wav", mk.healthy_wav, ladder=5), BEFORE_RUNG,
         r"ladder must name a ladder", raw=True),
    # ---- camfilter (a pipeline: VAD and YOLO stages, then the cut)
    Case("classes-empty", "camfilter", fields(media="x.mp4", classes=""), SUBMIT, r"classes: List should have"),
    Case("stride-negative", "camfilter", fields(media="x.mp4", stride=-1), SUBMIT, r"stride: Input should be greater"),
    Case("rules-pad-negative", "camfilter", fields(media="x.mp4", rules={"pad_before": -2}), SUBMIT,
         r"rules\.pad_before: Input should be greater than or equal to 0"),
    Case("rules-unknown-key", "camfilter", fields(media="x.mp4", rules={"padding": 2}), SUBMIT,
         r"rules\.padding: Extra inputs are not permitted"),
    Case("ok-a-still-image-has-nothing-to-cut", "camfilter", media("still.png", partial(mk.png, width=32, height=24)),
         ACCEPTED, check=lambda out: out["clips"] == [] and out["stages"]["vad"]["flags"] == ["no_audio"]),
    Case("text-file", "camfilter", media("notes.mp4", text_file), WORKER, r"failed, so cut never ran: .*" + NOT_READ),
    Case("outside-the-roots", "camfilter", lambda folder: {"media": str(folder / ".." / ".." / "etc.mp4")}, WORKER,
         r"failed, so cut never ran: .*outside the media roots"),
    Case("vad-ladder-unknown", "camfilter", media("mute.mp4", partial(make_video, duration=2.0), vad_ladder="nope"),
         BEFORE_RUNG, r"VAD .* failed, so cut never ran: .*no ladder 'nope'"),
]  # fmt: skip


def case_id(case: Case) -> str:
    return f"{case.family}:{case.id}"


@pytest.fixture(scope="module")
def battery_worker(start_worker, session_dir: Path):
    config = session_dir / "farm-malformed-test.toml"
    config.write_text((REPO / "tests" / "support" / "farm-test.toml").read_text() + LADDERS)
    _place_piper_voice()
    return start_worker("cpu", concurrency=2, queues=[QUEUE], env={"FARM_CONFIG_FILE": str(config)})


def _place_piper_voice() -> None:
    """The real Piper voice (test-only wheel) where the piper rung looks, for a machine without espeak-ng."""
    link_joe_voice(get_settings().models_dir, required=False)


@pytest.fixture(scope="module")
def inputs(media_root: Path) -> Path:
    folder = media_root / "battery"
    folder.mkdir(exist_ok=True)
    return folder


def job_id_of(case: Case) -> str:
    return f"mb-{case.family}-{case.id}-{uuid.uuid4().hex[:6]}"


def send(case: Case, request: dict[str, Any], job_id: str) -> JobHandle:
    spec = registry.get(case.family)
    if case.raw:
        app.send_task(spec.task_name, kwargs=request, task_id=job_id, queue=QUEUE)
        return JobHandle(job_id, spec.name)
    return submit(case.family, queue=QUEUE, job_id=job_id, **request)


@dataclass
class Ran:
    """A sent case's end. Attributes: handle, envelope (on success), failure (a JobFailed or
    TimeoutError otherwise), seconds (from the battery's start to the end seen)."""

    handle: JobHandle
    envelope: dict[str, Any] | None = None
    failure: Exception | None = None
    seconds: float = 0.0


@pytest.fixture(scope="module")
def battery(battery_worker, inputs: Path) -> dict[str, Ran]:
    """Every case that reaches the worker, sent at once, then waited for."""
    started = time.monotonic()
    runs = {
        case_id(case): Ran(send(case, case.make(inputs), job_id_of(case)))
        for case in CASES
        if case.expect != SUBMIT
    }
    for run in runs.values():
        try:
            run.envelope = run.handle.wait(timeout=120)
        except (JobFailed, TimeoutError) as exc:
            run.failure = exc
        run.seconds = time.monotonic() - started
    last = max(r.seconds for r in runs.values())
    print(f"\nmalformed battery: {len(runs)} jobs ended {last:.1f} s after the first send")
    return runs


def _history(job_id: str, family: str) -> list[str]:
    return [a["outcome"] for a in JobHandle(job_id, family).attempts() if a["outcome"] != "unavailable"]


def _assert_refused_once(run: Ran, case: Case) -> None:
    failure = run.failure
    assert isinstance(failure, JobRejected), (case.id, run.envelope or failure)
    assert re.search(case.reason, failure.reason), (case.reason, failure.reason)
    handle = run.handle
    expected = [] if case.expect == BEFORE_RUNG else ["rejected"]
    if not isinstance(handle, PipelineHandle):
        assert _history(handle.id, handle.family) == expected, handle.attempts()
        return
    plan = handle.plan()
    failed = [p for p in plan.parts if JobHandle(p.job_id, p.family).state() != "SUCCESS"]
    assert failed, "a pipeline refused with no failed stage"
    for part in failed:
        assert _history(part.job_id, part.family) == expected, (part.label, part.job_id)
    assert JobHandle(handle.id, handle.family).attempts() == []  # the fan-in job never ran


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_each_malformed_input_is_refused_once_naming_the_problem(case: Case, inputs: Path, request) -> None:
    if case.expect == SUBMIT:
        job_id = job_id_of(case)
        with pytest.raises(InvalidRequest) as refused:
            send(case, case.make(inputs), job_id)
        assert re.search(case.reason, str(refused.value)), (case.reason, str(refused.value))
        # Refused before anything was recorded or sent.
        assert app.backend.client.get(keys.submitted(job_id)) is None
        assert JobHandle(job_id, case.family).state() == "PENDING"
        return
    run = request.getfixturevalue("battery")[case_id(case)]
    if case.expect == ACCEPTED:
        assert run.envelope is not None, (case.id, run.failure)
        assert case.check is None or case.check(run.envelope["output"]), run.envelope["output"]
        return
    _assert_refused_once(run, case)


def answering_pid(worker) -> int:
    """The pid of the process that answers as ``worker``'s node (its main process)."""
    return app.control.inspect(destination=[worker.node], timeout=5).stats()[worker.node]["pid"]


def test_the_worker_lives_on_and_ran_nothing_twice(battery, battery_worker, inputs: Path) -> None:
    pid = battery_worker.main_pid()  # the process the fixture started
    assert answering_pid(battery_worker) == pid and battery_worker.process.poll() is None
    log = battery_worker.log_tail(20_000_000)
    for key, run in battery.items():
        ids = [run.handle.id]
        plan = run.handle.plan() if isinstance(run.handle, PipelineHandle) else None
        if plan is not None:
            ids += [p.job_id for p in plan.parts]
        for job_id in ids:
            assert received(battery_worker, job_id) <= 1, (key, job_id)
        if plan is None:
            assert f"[{run.handle.id}] received" in log, key
    # A normal job after the battery, on the same worker.
    envelope = submit("vad", queue=QUEUE, media=str(mk.healthy_wav(inputs / "after.wav", seconds=2.0))).wait(60)
    assert envelope["output"]["duration"] == pytest.approx(2.0, abs=0.05)
    assert envelope["attempts"][-1]["worker"] == battery_worker.node
    assert battery_worker.process.poll() is None and answering_pid(battery_worker) == pid


def test_the_battery_is_wide_enough() -> None:
    assert len(CASES) >= 50 and len({case_id(c) for c in CASES}) == len(CASES)
    assert {c.family for c in CASES} == set(registry.load()) - {"chaos", "toy"}
    assert {c.expect for c in CASES} == {SUBMIT, WORKER, BEFORE_RUNG, ACCEPTED}
