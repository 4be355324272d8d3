"""The live cue clock (PTS anchors, jumps, drift) and the live-source allow-list, on plain numbers."""

from __future__ import annotations

import pytest

from mediafarm.tasks.families.subtitle_live.clock import MPEGTS_HZ, StreamClock
from mediafarm.tasks.families.subtitle_live.sources import SourceNotAllowed, check_source, parse_rules

RATE = 16000


def frames(clock: StreamClock, pts: list[float], samples: int = 1600) -> list:
    return [clock.anchor(i * samples, p) for i, p in enumerate(pts)]


def test_cue_time_is_pts_less_the_origin() -> None:
    clock = StreamClock(RATE)
    frames(clock, [10.0, 10.1, 10.2])
    assert clock.origin == 10.0
    assert clock.time_at(3200 + 800) == pytest.approx(0.25)
    assert clock.mpegts(0.0) == 10 * MPEGTS_HZ and not clock.discontinuities


def test_small_drift_is_followed_and_measured() -> None:
    clock = StreamClock(RATE)
    # The sender's PTS run 50 ms ahead of the samples by the third frame.
    frames(clock, [10.0, 10.1, 10.25])
    assert clock.time_at(3200) == pytest.approx(0.25)
    assert clock.drift_max == pytest.approx(0.05) and not clock.discontinuities


def test_a_jump_is_recorded_and_the_cue_clock_runs_on() -> None:
    clock = StreamClock(RATE)
    frames(clock, [10.0, 10.1, 95.0, 95.1])
    [jump] = clock.discontinuities
    assert jump.at == pytest.approx(0.2) and jump.jump == pytest.approx(84.8)
    assert clock.time_at(4800) == pytest.approx(0.3)  # no leap: the samples' time goes on
    assert clock.mpegts(0.3) == round(95.1 * MPEGTS_HZ)  # but maps onto the new timestamps


def test_frames_without_pts_follow_the_samples() -> None:
    clock = StreamClock(RATE)
    frames(clock, [5.0, None, None])  # type: ignore[list-item]
    assert clock.time_at(3200) == pytest.approx(0.2)


def test_a_resumed_attempt_joins_at_the_stream_time_and_backward_timestamps_are_held() -> None:
    clock = StreamClock(RATE, origin=10.0)
    clock.anchor(0, 40.0)  # a new attempt's first frame: 30 s in, whatever its sample count
    assert clock.time_at(1600) == pytest.approx(30.1)
    back = StreamClock(RATE, origin=10.0)
    back.anchor(0, 12.0)
    jump = back.hold(30.0)  # the sender restarted lower: the cue clock must not go back
    assert back.time_at(0) == 30.0 and jump.jump == pytest.approx(-28.0) and back.discontinuities == [jump]


def test_the_allow_list() -> None:
    assert check_source("udp://127.0.0.1:5000", ["loopback"])
    assert check_source("http://[::1]:8000/live.m3u8", ["loopback"])
    assert check_source("udp://239.1.2.3:5000", ["udp://239.0.0.0/8"])
    assert check_source("srt://cam.example:9000", ["srt://cam.example:9000"])
    with pytest.raises(SourceNotAllowed, match=r"live source udp://10\.0\.0\.1:5000 is not configured.*loopback"):
        check_source("udp://10.0.0.1:5000", ["loopback"])
    with pytest.raises(SourceNotAllowed, match="not configured"):
        check_source("srt://cam.example:9001", ["srt://cam.example:9000"])  # another port
    with pytest.raises(SourceNotAllowed, match="scheme 'file' is not one the farm reads live"):
        check_source("file:///etc/passwd", ["loopback"])
    with pytest.raises(SourceNotAllowed, match="names no host"):
        check_source("udp://:5000", ["loopback"])
    with pytest.raises(SourceNotAllowed, match="FARM_LIVE_SOURCES entry 'gopher://x'"):
        parse_rules(["gopher://x"])
