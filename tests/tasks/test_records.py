"""The typed records survive a JSON round trip, and old or new fields do not break loading."""

from __future__ import annotations

import json

import pytest

from mediafarm.tasks.wire.records import (
    ArtifactInfo,
    Attempt,
    Envelope,
    KillRecord,
    Outcome,
    Progress,
    envelope_in_current_names,
    in_current_names,
    rung_named,
    rung_of,
)


def _through_json(data: dict) -> dict:
    """What a record looks like after Redis: dumped and parsed back."""
    return json.loads(json.dumps(data))


def test_attempt_round_trip_turns_the_outcome_string_back_into_the_enum() -> None:
    attempt = Attempt(2, "webrtc", Outcome.OOM, "MemoryError", retries=1, started=100.0, duration=3.5,
                      peak_rss_mb=812.5, host="h1", worker="cpu@h1", pid=4242)  # fmt: skip
    wire = _through_json(attempt.to_json())
    assert wire["outcome"] == "oom"
    loaded = Attempt.from_json(wire)
    assert loaded == attempt
    assert loaded.outcome is Outcome.OOM


def test_running_attempt_round_trips_with_no_outcome() -> None:
    attempt = Attempt(0, "silero-onnx", started=5.0, worker="w", pid=1)
    loaded = Attempt.from_json(_through_json(attempt.to_json()))
    assert loaded.outcome is None and loaded == attempt


def test_attempt_from_json_ignores_unknown_keys_and_defaults_missing_ones() -> None:
    loaded = Attempt.from_json({"rung": 1, "variant": "skip", "outcome": "killed", "gpu_mb": 12, "future": [1]})
    assert (loaded.rung_index, loaded.rung, loaded.outcome) == (1, "skip", Outcome.KILLED)
    assert loaded.reason == "" and loaded.duration is None


def test_an_outcome_from_a_newer_farm_reads_as_error() -> None:
    # Neither moves the job down nor runs the rung again, and reading the history does not crash.
    attempt = Attempt.from_json({"rung": 0, "variant": "x", "outcome": "exploded"})
    assert attempt.outcome is Outcome.ERROR and not attempt.outcome.moves_down


def test_kill_record_round_trip() -> None:
    kill = KillRecord(pid=77, worker="cpu@h", at=12.0, outcome=Outcome.TIMEOUT, reason="past 90 s", rss_mb=100.0, cap_mb=400)
    wire = _through_json(kill.to_json())
    assert wire["outcome"] == "timeout"
    loaded = KillRecord.from_json({**wire, "extra": "ignored"})
    assert loaded == kill and loaded.outcome is Outcome.TIMEOUT


def test_kill_record_outcome_string_becomes_the_enum() -> None:
    assert KillRecord(pid=1, worker="w", at=0.0, outcome="killed").outcome is Outcome.KILLED


def test_progress_round_trip_ignores_unknown_keys() -> None:
    progress = Progress(0.5, "decode", 12.0, attempt=1, rung_index=2, rung="webrtc", updated=9.0)
    loaded = Progress.from_json({**_through_json(progress.to_json()), "eta": 3})
    assert loaded == progress


def test_artifact_info_round_trip_ignores_unknown_keys() -> None:
    info = ArtifactInfo("chunks/0001.wav", 44, "audio/x-wav", "ab" * 32)
    assert ArtifactInfo.from_json({**_through_json(info.to_json()), "etag": "x"}) == info
    stored = ArtifactInfo("a.wav", 44, "audio/x-wav", "ab" * 32, "/w/a.wav", "s3://farm/jobs/j/0/a.wav")
    assert ArtifactInfo.from_json(_through_json(stored.to_json())) == stored


def test_envelope_round_trip_rebuilds_attempts_and_artifacts() -> None:
    envelope = Envelope(
        job_id="j1", family="vad", rung="webrtc", rung_index=1, output={"spans": [{"start": 0.0, "end": 1.5}]},
        attempts=(Attempt(0, "silero-onnx", "killed", started=1.0, worker="w", pid=3),
                  Attempt(1, "webrtc", Outcome.OK, started=2.0, worker="w", pid=3)),
        artifacts=(ArtifactInfo("a.json", 2, "application/json", "00" * 32),),
    )  # fmt: skip
    loaded = Envelope.from_json(_through_json(envelope.to_json()))
    assert loaded == envelope
    assert [a.outcome for a in loaded.attempts] == [Outcome.KILLED, Outcome.OK]
    assert isinstance(loaded.artifacts[0], ArtifactInfo)


def test_envelope_from_json_ignores_unknown_keys_and_defaults_missing_lists() -> None:
    loaded = Envelope.from_json({"job_id": "j", "family": "toy", "variant": "plain", "rung": "1",
                                 "output": None, "version": 2})  # fmt: skip
    assert (loaded.rung, loaded.rung_index) == ("plain", 1)
    assert loaded.output == {} and loaded.attempts == () and loaded.artifacts == ()


def _attempt() -> Attempt:
    return Attempt(0, "big", started=100.0, worker="chaos@h", pid=500)


def test_kill_record_is_about_the_same_child_worker_and_a_later_time() -> None:
    attempt = _attempt()
    assert KillRecord(pid=500, worker="chaos@h", at=100.0).is_about(attempt)
    assert KillRecord(pid=500, worker="chaos@h", at=150.0).is_about(attempt)


@pytest.mark.parametrize(
    "kill",
    [
        KillRecord(pid=501, worker="chaos@h", at=150.0),  # another child
        KillRecord(pid=500, worker="chaos@other", at=150.0),  # same pid on another worker
        KillRecord(pid=500, worker="chaos@h", at=99.9),  # killed before this attempt started
    ],
)
def test_kill_record_is_not_about_an_attempt_it_does_not_match(kill: KillRecord) -> None:
    assert not kill.is_about(_attempt())


MOVES_DOWN = {Outcome.KILLED, Outcome.OOM, Outcome.CUDA_OOM, Outcome.TIMEOUT, Outcome.UNAVAILABLE, Outcome.SKIPPED}


@pytest.mark.parametrize("outcome", list(Outcome))
def test_only_resource_failures_and_unavailable_rungs_move_down(outcome: Outcome) -> None:
    assert outcome.moves_down is (outcome in MOVES_DOWN)


def test_every_outcome_is_covered_by_the_moves_down_table() -> None:
    # A new Outcome must be classified on purpose here, not by accident.
    assert {o.value for o in Outcome} == {
        "ok", "killed", "oom", "cuda_oom", "timeout", "unavailable", "skipped", "rejected", "error",
        "cancelled", "transient", "worker_lost", "stalled", "rerouted", "moved",
    }  # fmt: skip
    # A job sent back to be routed again ran nothing: its rung is not spent (tasks.runtime.reroute).
    assert not Outcome.REROUTED.moves_down
    # Nor a job moved to another pool's queue (tasks.producer.routing).
    assert not Outcome.MOVED.moves_down
    # A stall moves a job down only when it repeats on its rung (tasks.runtime.downgrade.repeated_stall).
    assert not Outcome.STALLED.moves_down


def test_the_wire_names_a_rung_by_rung_and_rung_index_and_still_writes_variant_for_one_release() -> None:
    attempt = Attempt(1, "webrtc", Outcome.OK, started=2.0, worker="w", pid=3)
    progress = Progress(0.5, "decode", attempt=1, rung_index=1, rung="webrtc", updated=9.0)
    envelope = Envelope("j1", "vad", "webrtc", 1, {}, attempts=(attempt,))
    for wire in (attempt.to_json(), progress.to_json(), envelope.to_json(), envelope.to_json()["attempts"][0]):
        assert (wire["rung"], wire["rung_index"], wire["variant"]) == ("webrtc", 1, "webrtc"), wire


def test_records_of_the_release_before_read_in_this_releases_names() -> None:
    # Version 1: "rung" was the index and "variant" the name.
    old = {"rung": 2, "variant": "frugal", "outcome": "killed", "started": 1.0}
    assert in_current_names(old) == {**old, "rung": "frugal", "rung_index": 2, "variant": "frugal"}
    assert (Attempt.from_json(old).rung, Attempt.from_json(old).rung_index) == ("frugal", 2)
    assert (Progress.from_json({"rung": 2, "variant": "frugal"}).rung_index) == 2
    envelope = envelope_in_current_names({"job_id": "j", "family": "vad", "variant": "frugal", "rung": 2,
                                          "output": {}, "attempts": [old]})  # fmt: skip
    assert (envelope["rung"], envelope["rung_index"]) == ("frugal", 2)
    assert (envelope["attempts"][0]["rung"], envelope["attempts"][0]["rung_index"]) == ("frugal", 2)
    # This release's: as they are, the very same dicts.
    current = Attempt(0, "big", started=1.0).to_json()
    assert in_current_names(current) is current
    written = Envelope("j", "vad", "big", 0, {}, attempts=(Attempt(0, "big", started=1.0),)).to_json()
    assert envelope_in_current_names(written) is written
    # A family result of the release before (variant only) gets its rung, and its attempts theirs.
    assert rung_named({"variant": "piper", "outcome": "ok"}) == {"variant": "piper", "outcome": "ok", "rung": "piper"}
    stage = rung_named({"variant": "vad-a", "attempts": [{"rung": 1, "variant": "vad-a"}, "not a record"]})
    assert stage["attempts"] == [{"rung": "vad-a", "rung_index": 1, "variant": "vad-a"}, "not a record"]


def test_odd_rung_fields_read_as_a_well_typed_rung() -> None:
    # JSON's Infinity, a string index, and a record that is neither version's read without raising.
    assert rung_of({"rung": float("inf"), "variant": "a"}) == ("a", 0)
    assert Attempt.from_json({"rung_index": "3", "rung": "a", "variant": "a"}).rung_index == 3
    assert in_current_names({"rung_index": 2, "rung": "b"}) == {"rung_index": 2, "rung": "b", "variant": "b"}
    assert rung_of({}) == ("", 0)
