"""Live subtitle jobs on a real worker and real Redis, from streams FFmpeg publishes in real time.

The speech is espeak-ng's, placed at known times (tests/support/speech.py); the publisher pins the
stream's timestamps (first sample at PTS 10 s, tests/support/live_stream.py), so a sentence's true
onset on the stream clock is known to the sample and the job's cue times are checked against it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import soundfile as sf

from mediafarm import JobRejected, submit
from mediafarm.config.settings import get_settings
from mediafarm.tasks.families.subtitle_live.push import AudioPush
from mediafarm.tasks.kit import farm_redis
from tests.support.kills import kill_running
from tests.support.live_stream import (
    free_port,
    http_folder,
    playlist_while_playing,
    publish_hls,
    publish_tcp,
    publish_udp,
    real_time_pieces,
    track_pcm,
    wait_listening,
)
from tests.support.speech import PHRASES, RATE, make_track

pytestmark = pytest.mark.integration
BOUND_S = 0.112  # the subtitle story's perceptible offset
TS_OFFSET = 10.0  # PTS of the first published sample


@pytest.fixture(scope="module")
def track(tmp_path_factory):
    folder = tmp_path_factory.mktemp("live")
    # Four sentences, ~21 s: long enough to see cues while it plays, short enough for a test.
    return make_track(folder / "live.wav", gaps=(1.0, 2.0, 2.5, 2.0, 2.0), phrases=PHRASES[:4])


def _started(job, variant: str = "whisper-tiny", timeout: float = 120.0) -> None:
    """Wait until the job's attempt on ``variant`` has loaded its model and is opening the stream
    (its progress says ``connecting``), so a UDP sender's first packets find the socket."""
    deadline = time.monotonic() + timeout
    while True:
        progress = job.progress()
        if progress is not None and progress.rung == variant and progress.stage in ("connecting", "live"):
            break
        assert time.monotonic() < deadline, f"no {variant} attempt began: {job.attempts()}"
        time.sleep(0.05)
    time.sleep(1.0)  # the socket is bound just after the report


def _follow(job, publisher) -> dict[str, float]:
    """Segment name → wall time it was first announced, while ``publisher`` runs and until the job ends."""
    seen: dict[str, float] = {}
    while job.state() not in ("SUCCESS", "FAILURE", "REVOKED"):
        for item in job.partials():
            seen.setdefault(item["segment"], time.time())
        time.sleep(0.05)
    return seen


def _matches(found: list[tuple[float, float]], truth: list[tuple[float, float]], shift: float) -> list[float]:
    """For each true sentence, |true onset - nearest found onset| on the stream clock (found + shift)."""
    onsets = np.array([s + shift for s, _ in found])
    return [float(np.min(np.abs(onsets - start))) for start, _ in truth]


def test_a_live_udp_stream_gets_cues_while_it_plays_on_the_stream_clock(cpu_worker, tiny_en, track) -> None:
    port = free_port()
    # 8 s of silence ends it: on a loaded machine FFmpeg's first packet came more than 4 s after the
    # socket was bound (seen twice), and the job then ended as stalled before the stream began.
    job = submit("subtitle-live", stream=f"udp://127.0.0.1:{port}", chunk_seconds=2, stall_timeout_s=8)
    _started(job)
    began = time.time()
    publisher = publish_udp(track.path, port, ts_offset=TS_OFFSET)
    seen = _follow(job, publisher)
    assert publisher.wait(5) == 0
    stream_end = began + track.duration
    envelope = job.wait(timeout=60)
    output = envelope["output"]
    # UDP has no end of stream: the publisher's silence is a stall, and the job says so.
    assert output["end_reason"].startswith("stalled"), output["end_reason"]
    timing = output["timing"]
    shift = timing["origin_pts"] - TS_OFFSET  # cue time + shift = time in the WAV
    # The VAD's speech onsets and every cue start sit on the stream clock within 112 ms of the truth.
    assert max(_matches([tuple(s) for s in output["speech"]], track.truth, shift)) <= BOUND_S
    cues = [(c["start"], c["end"]) for c in _cues(job)]
    assert len(cues) == len(track.truth)
    assert max(_matches(cues, track.truth, shift)) <= BOUND_S
    assert timing["late"] == [] and timing["rule_violations"] == [] and timing["overlaps"] == 0
    assert timing["discontinuities"] == [] and timing["gaps"] == [] and timing["drift_ms_max"] < BOUND_S * 1000
    # Cues came out while the stream still played, each measured (its sentence's end sent → its
    # segment and the playlist written) ...
    assert min(seen.values()) < stream_end
    assert timing["latencies"] == len(track.truth)
    # ... within the 3 s goal (P95) where the machine has the CPU for it: on one running several
    # times its cores' worth (a shared CI box), the recogniser waits for a core and the bound says
    # nothing about the engine. docs/benchmarks/subtitle-live.md has the figures of both.
    # A miss fails either way: on a loaded machine the recogniser gets cores/load of a core, so its
    # share of the latency stretches by load/cores at most, and the bound with it.
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    bound = 3000 * max(1.0, load / cores)
    assert timing["latency_ms_p95"] <= bound, f"P95 over {bound:.0f} ms at load {load:.1f} on {cores} cores: {timing}"
    playlist = _artifact(job, "chunks/playlist.m3u8")
    assert "#EXT-X-PLAYLIST-TYPE:EVENT" in playlist and playlist.rstrip().endswith("#EXT-X-ENDLIST")
    first = _artifact(job, "chunks/segment_00000.vtt")
    assert f"X-TIMESTAMP-MAP=MPEGTS:{round(timing['origin_pts'] * 90000)}," in first


def test_a_timestamp_jump_mid_stream_is_found_and_re_anchored(cpu_worker, tiny_en, track, tmp_path) -> None:
    audio, _ = sf.read(track.path, dtype="float32")
    split = int(8.0 * RATE)  # in the silence after the second sentence
    sf.write(tmp_path / "a.wav", audio[:split], RATE, subtype="PCM_16")
    sf.write(tmp_path / "b.wav", audio[split:], RATE, subtype="PCM_16")
    assert all(not (s < split / RATE < e) for s, e in track.truth)
    port = free_port()
    job = submit("subtitle-live", stream=f"udp://127.0.0.1:{port}", chunk_seconds=2, stall_timeout_s=10)  # the second sender's start
    _started(job)
    # The second publisher is a restarted encoder: its timestamps start at 100 s, the content goes on.
    assert publish_udp(tmp_path / "a.wav", port, ts_offset=TS_OFFSET).wait(30) == 0
    assert publish_udp(tmp_path / "b.wav", port, ts_offset=100.0).wait(30) == 0
    output = job.wait(timeout=60)["output"]
    timing = output["timing"]
    shift = timing["origin_pts"] - TS_OFFSET
    [jump] = timing["discontinuities"]
    assert abs(jump["at"] - (8.0 - shift)) < 0.1
    assert abs(jump["jump"] - (100.0 - TS_OFFSET - 8.0)) < 0.1
    # Re-anchored: the sentences after the jump keep their place in the content, within 112 ms.
    assert max(_matches([tuple(s) for s in output["speech"]], track.truth, shift)) <= BOUND_S
    assert max(_matches([(c["start"], c["end"]) for c in _cues(job)], track.truth, shift)) <= BOUND_S
    # Segments after the jump map cue time 0 onto the new timestamps.
    last = _artifact(job, f"chunks/segment_{output['duration'] // 2 - 1:05.0f}.vtt")
    assert f"MPEGTS:{round((timing['origin_pts'] + jump['jump']) * 90000)}," in last


def test_a_child_killed_mid_stream_comes_back_at_the_live_edge_with_the_gap_recorded(
    cpu_worker, tiny_en, track
) -> None:
    port = free_port()
    job = submit("subtitle-live", stream=f"udp://127.0.0.1:{port}", chunk_seconds=2, stall_timeout_s=6)
    _started(job)
    publisher = publish_udp(track.path, port, ts_offset=TS_OFFSET)
    # After the first sentence's cue is out (its segment announced), the child dies.
    deadline = time.monotonic() + 30
    while not job.partials():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    killed = kill_running(job, "whisper-tiny")
    assert publisher.wait(40) == 0
    envelope = job.wait(timeout=60)
    output = envelope["output"]
    attempts = envelope["attempts"]
    assert attempts[-2]["pid"] == killed["pid"] and attempts[-2]["outcome"] == "killed"
    # A resource failure: the next rung goes on, from the checkpoint, not from the start.
    assert attempts[-1]["variant"] == "pocketsphinx" and attempts[-1]["outcome"] == "ok"
    assert attempts[-1]["resumed_from"] is not None
    assert output["attempts"] == 2
    [gap] = output["timing"]["gaps"]
    assert 0 < gap["start"] < gap["end"] < track.duration and "lost" in gap["reason"]
    # Nothing is made up for the gap, and what came before it is kept.
    cues = _cues(job)
    assert cues and cues[0]["start"] < gap["start"]
    assert all(c["end"] <= gap["start"] + 0.01 or c["start"] >= gap["end"] - 0.01 for c in cues)
    # A player is told which segments hold no output: #EXT-X-GAP before each one wholly inside the gap, no other.
    tagged, due = _gap_tags(_artifact(job, "chunks/playlist.m3u8"), output["timing"]["gaps"], chunk_seconds=2)
    assert tagged == due, (tagged, due, gap)


def _gap_tags(playlist: str, gaps: list[dict], chunk_seconds: float) -> tuple[list[int], list[int]]:
    """(the segments the playlist tags #EXT-X-GAP, the segments wholly inside a gap: those due one)."""
    lines = playlist.splitlines()
    segments = [(i, int(line[len("segment_") : -len(".vtt")])) for i, line in enumerate(lines)
                if line.startswith("segment_") and line.endswith(".vtt")]  # fmt: skip
    tagged = [k for i, k in segments if "#EXT-X-GAP" in lines[max(0, i - 2) : i]]
    due = [k for _, k in segments
           if any(g["start"] <= k * chunk_seconds and (k + 1) * chunk_seconds <= g["end"] for g in gaps)]  # fmt: skip
    return tagged, due


def _push_in_real_time(push, pcm: bytes) -> threading.Thread:
    """A thread writing ``pcm`` (16 kHz mono s16le) to ``push`` at the pace it plays, 100 ms at a
    time, then ending the stream."""

    def pushing() -> None:
        for piece in real_time_pieces(pcm, RATE):
            push.write(piece)
        push.end()

    thread = threading.Thread(target=pushing, daemon=True)
    thread.start()
    return thread


def _first_segment(job, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not job.partials():
        assert time.monotonic() < deadline, job.attempts()
        time.sleep(0.05)


def _no_gap_and_every_sentence_once(job, output, track) -> list[dict]:
    """The checks of a pushed job that lost an attempt: the next one read the audio again from its
    checkpoint, so nothing is missing (no gap) and nothing is there twice (a span and a cue a
    sentence, each at its true onset)."""
    assert output["timing"]["gaps"] == [] and output["timing"]["discontinuities"] == []
    assert output["end_reason"].startswith("ended"), output["end_reason"]
    assert output["spans"] == len(track.truth)
    cues = _cues(job)
    assert len(cues) == len(track.truth), cues
    assert max(_matches([(c["start"], c["end"]) for c in cues], track.truth, 0.0)) <= BOUND_S
    assert output["timing"]["overlaps"] == 0 and output["timing"]["rule_violations"] == []
    return cues


def test_a_pushed_stream_killed_mid_stream_is_read_again_from_its_checkpoint_with_nothing_missed(
    cpu_worker, tiny_en, track
) -> None:
    push = AudioPush(farm_redis())
    job = submit("subtitle-live", stream=push.url, chunk_seconds=2, stall_timeout_s=10)
    pusher = _push_in_real_time(push, track_pcm(track.path))
    _first_segment(job)  # the first sentence's segment is out: then the child dies
    killed = kill_running(job, "whisper-tiny")
    pusher.join(60)
    envelope = job.wait(timeout=90)
    attempts = envelope["attempts"]
    assert attempts[-2]["pid"] == killed["pid"] and attempts[-2]["outcome"] == "killed"
    assert attempts[-1]["variant"] == "pocketsphinx" and attempts[-1]["resumed_from"] is not None
    cues = _no_gap_and_every_sentence_once(job, envelope["output"], track)
    assert {c.get("rung") for c in cues} == {"whisper-tiny", "pocketsphinx"}


DEATH_QUEUE = "live-death"


@pytest.fixture()
def death_workers(start_worker, session_dir):
    """Factory: workers on their own queue under a 45 s visibility timeout (a live job's limits
    below it: maximum 30 s, soft 35 s, hard 40 s; every other family's 6/7 s), stopped when the
    test ends: their restore sweep hands back every queue's unacked messages older than 45 s."""
    from mediafarm.workers.launch import stop_worker
    from tests.support.chaos_suite import short_limits_config

    config = short_limits_config(session_dir / "live-death.toml")  # every family 6/7 s ...
    short = "[limits.subtitle-live]\nsoft = 6\nhard = 7"
    assert short in config.read_text()
    config.write_text(config.read_text().replace(short, "[limits.subtitle-live]\nsoft = 35\nhard = 40"))  # ... but live
    env = {"FARM_CONFIG_FILE": str(config), "FARM_VISIBILITY_TIMEOUT": "45", "FARM_RESTORE_INTERVAL": "1",
           "FARM_LIVE_MAX_SECONDS": "30"}  # fmt: skip
    started = []

    def start():
        started.append(start_worker("cpu", concurrency=1, queues=[DEATH_QUEUE], env=env))
        return started[-1]

    yield start
    for worker in started:
        stop_worker(worker.process, timeout=20)


def test_a_live_job_whose_whole_worker_dies_goes_on_on_another_worker(death_workers, tiny_en, track) -> None:
    first = death_workers()
    push = AudioPush(farm_redis())
    job = submit("subtitle-live", queue=DEATH_QUEUE, stream=push.url, chunk_seconds=2, stall_timeout_s=90)
    pusher = _push_in_real_time(push, track_pcm(track.path))
    _first_segment(job)
    # The whole worker dies mid-stream: main process and children, as in a machine or container loss.
    os.killpg(first.main_pid(), signal.SIGKILL)
    first.process.wait(10)
    second = death_workers()
    pusher.join(60)  # the rest of the stream waits in Redis for whoever reads it next
    envelope = job.wait(timeout=150)
    *_, lost, ok = envelope["attempts"]  # after the GPU rung's "unavailable" record
    assert (lost["outcome"], ok["outcome"]) == ("worker_lost", "ok")
    assert lost["variant"] == ok["variant"] == "whisper-tiny"  # not the job's fault: same rung
    assert (lost["worker"], ok["worker"]) == (first.node, second.node)
    assert ok["resumed_from"] is not None
    # The redelivery came after the 45 s visibility timeout, past the 30 s maximum counted on the
    # wall clock: the maximum counts the attempts' running time, so the job went on to the end.
    _no_gap_and_every_sentence_once(job, envelope["output"], track)


def test_a_live_hls_stream_over_local_http(cpu_worker, tiny_en, track, tmp_path) -> None:
    folder = tmp_path / "hls"
    publisher = publish_hls(track.path, folder, ts_offset=TS_OFFSET)
    deadline = time.monotonic() + 20
    while not (folder / "live.m3u8").exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with http_folder(folder) as base:
        job = submit("subtitle-live", stream=f"{base}/live.m3u8", chunk_seconds=2, stall_timeout_s=8)
        assert publisher.wait(40) == 0
        output = job.wait(timeout=60)["output"]
    # HLS says where it ends (#EXT-X-ENDLIST): the job ends with the stream, not on a stall.
    assert output["end_reason"].startswith("ended"), output["end_reason"]
    # FFmpeg joins a live playlist a few segments from its end (its live_start_index), so a job that
    # starts after the sender may miss the first sentence or join in the middle of one (a cue at the
    # very start of its clock); every cue after that starts on the stream clock at a true onset.
    shift = output["timing"]["origin_pts"] - TS_OFFSET
    onsets = [start for start, _ in track.truth]
    cues = [c for c in _cues(job) if c["start"] > 0.5]
    assert len(cues) >= 2
    assert all(min(abs(c["start"] + shift - o) for o in onsets) <= BOUND_S for c in cues), (cues, shift)


def test_a_live_tcp_stream_ends_with_its_sender(cpu_worker, tiny_en, track) -> None:
    port = free_port(socket.SOCK_STREAM)
    publisher = publish_tcp(track.path, port, ts_offset=TS_OFFSET)  # listens; sends once the job connects
    wait_listening(port)  # a job connecting before FFmpeg listens is refused: the stream cannot be opened
    job = submit("subtitle-live", stream=f"tcp://127.0.0.1:{port}", chunk_seconds=2, stall_timeout_s=30)
    # TCP pushes back: a child behind the stream (a loaded machine) slows the sender down.
    assert publisher.wait(120) == 0
    output = job.wait(timeout=60)["output"]
    # The sender closing the connection is the end of the stream, told apart from a stall.
    assert output["end_reason"].startswith("ended"), output["end_reason"]
    shift = output["timing"]["origin_pts"] - TS_OFFSET
    assert max(_matches([(c["start"], c["end"]) for c in _cues(job)], track.truth, shift)) <= BOUND_S


def test_farm_submit_live_follows_the_playlist_as_it_grows(cpu_worker, tiny_en, track, tmp_path) -> None:
    port = free_port()
    out = tmp_path / "out"
    farm = subprocess.Popen(
        [sys.executable, "-m", "mediafarm.workers.cli", "submit", "subtitle", f"udp://127.0.0.1:{port}", "--live",
         "--out", str(out), "-p", "stall_timeout_s=4", "-p", "chunk_seconds=2"],
        env={**os.environ, "COLUMNS": "200"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert farm.stdout is not None
    job_id = farm.stdout.readline().split(":")[0].strip()  # "<id>: following DIR/chunks/playlist.m3u8"
    from mediafarm.tasks.producer.client import handle

    _started(handle(job_id))
    publisher = publish_udp(track.path, port, ts_offset=TS_OFFSET)
    # While the stream plays, DIR holds a playlist whose every segment is already there.
    playlist = playlist_while_playing(out, publisher)
    assert "#EXT-X-ENDLIST" not in playlist.read_text()
    assert publisher.wait(40) == 0
    stdout, _ = farm.communicate(timeout=60)
    assert farm.returncode == 0, stdout
    assert "segment chunks/segment_00000.vtt" in stdout
    assert playlist.read_text().rstrip().endswith("#EXT-X-ENDLIST") and (out / "subtitles.vtt").exists()


def test_an_unconfigured_source_is_refused_at_once(cpu_worker) -> None:
    job = submit("subtitle-live", stream="udp://10.20.30.40:5000")
    with pytest.raises(JobRejected, match=r"live source udp://10\.20\.30\.40:5000 is not configured.*FARM_LIVE_SOURCES"):
        job.wait(timeout=30)


def test_a_stream_that_never_starts_ends_the_job_as_stalled(cpu_worker, tiny_en) -> None:
    job = submit("subtitle-live", stream=f"udp://127.0.0.1:{free_port()}", stall_timeout_s=2)
    output = job.wait(timeout=60)["output"]
    assert output["end_reason"] == "stalled: nothing came from the stream within 2 s (stall_timeout_s)"
    assert output["cues"] == 0


def _segment_start(name: str) -> float:
    return int(name.rsplit("_", 1)[1].split(".")[0]) * 2.0


def _artifact(job, name: str) -> str:
    return (get_settings().storage_dir / job.id / name).read_text()


def _cues(job) -> list[dict]:
    import json

    return json.loads(_artifact(job, "subtitles.json"))["cues"]
