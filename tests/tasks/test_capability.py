"""The capability record (``tasks.wire.capability``): rungs judged by their own checks, queues left out,
the record written and read on the session's real Redis, and the sending back of a job that reached
a worker that cannot run it (``tasks.runtime.reroute``, ``tasks.runtime.downgrade.run_ladder``)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import redis

from mediafarm.config.ladders import Ladder, rung
from mediafarm.tasks import registry
from mediafarm.tasks.runtime.downgrade import LadderRun, RetryRequest, current_rung, run_ladder
from mediafarm.tasks.runtime.reroute import MAX_REROUTES, decide, sender
from mediafarm.tasks.runtime.rung_policies import Availability
from mediafarm.tasks.wire import capability, keys
from mediafarm.tasks.wire.capability import WorkerCapability
from mediafarm.tasks.wire.errors import NoRungLeft
from mediafarm.tasks.wire.family import EngineSpec
from mediafarm.tasks.wire.history import AttemptLog
from mediafarm.tasks.wire.records import Attempt, Outcome
from tests.support import weighted

QUEUES = {"weighted": "weighted", "toy": "toy"}


def judged(models: Path) -> dict:
    return capability.judge_rungs([weighted.FAMILY], lambda spec: [spec.default_ladder], models)


def test_a_rung_is_judged_by_its_engines_own_check(tmp_path: Path) -> None:
    without = judged(tmp_path)["weighted"]["weighted"]["from-file"]
    assert "model 'weighted.bin' is not in the models dir" in without and str(tmp_path) in without
    (tmp_path / weighted.WEIGHTS).write_bytes(b"w" * 10)
    assert judged(tmp_path) == {"weighted": {"weighted": {"from-file": ""}}}
    # Every ladder of a family, each rung by its own engine: a package missing, a GPU rung.
    chaos = capability.judge_rungs([registry.get("chaos")], registry.ladders_of, tmp_path)["chaos"]
    fancy, gpu, plain = chaos["unavailable_first"].values()
    assert "package 'a_package_that_is_not_installed' is not installed" in fancy and plain == ""
    assert gpu == (EngineSpec("x:y").unavailable(rung("g", "e", device="cuda")) or "")


def test_the_queues_of_a_family_that_cannot_run_are_left_out_and_others_kept(tmp_path: Path) -> None:
    rungs = judged(tmp_path)
    left = capability.left_out_queues(["weighted", "gpu3.weighted", "my-own", "toy"], rungs, QUEUES)
    assert set(left) == {"weighted", "gpu3.weighted"}  # my-own is no family's; toy was not judged here
    assert left["weighted"].startswith("weighted: no rung runnable: model 'weighted.bin' is not in")
    (tmp_path / weighted.WEIGHTS).write_bytes(b"w")
    assert capability.left_out_queues(["weighted"], judged(tmp_path), QUEUES) == {}
    assert capability.served_families(["gpu3.weighted", "my-own"], QUEUES) == ("weighted",)


def record(node: str, *, runs: bool, queues: tuple[str, ...] = ("weighted",), at: float = 0.0) -> WorkerCapability:
    why = "" if runs else "model 'weighted.bin' is not in the models dir"
    served = ("weighted",) if runs else ()
    return WorkerCapability(node, "cpu", queues if runs else ("mine",), {} if runs else {"weighted": why}, served,
                            {"weighted": {"weighted": {"from-file": why}}}, at)  # fmt: skip


def test_a_record_says_what_runs_only_for_families_whose_queues_it_consumes() -> None:
    able, unable = record("a@h", runs=True), record("b@h", runs=False)
    assert able.runnable("weighted") == {"weighted": ("from-file",)}
    assert able.can_run("weighted", "weighted", "from-file")
    assert unable.runnable("weighted") == {} and not unable.can_run("weighted", "weighted", "from-file")
    again = WorkerCapability.from_json(able.to_json())
    assert again == able
    # A record of an older or newer farm: unknown keys ignored, missing ones take their defaults.
    assert WorkerCapability.from_json(json.dumps({"node": "c@h", "pool": "p", "extra": 1})).queues == ()


@pytest.fixture()
def client(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def test_records_are_written_with_the_servers_time_and_a_silent_workers_lapses(client: redis.Redis) -> None:
    node = f"cap-{uuid.uuid4().hex[:6]}@h"
    at = capability.advertise(client, record(node, runs=True))
    seconds, micros = client.time()
    assert abs(seconds + micros / 1e6 - at) < 2
    mine = [r for r in capability.live(client) if r.node == node]
    assert len(mine) == 1 and mine[0].at == pytest.approx(at, abs=0.01) and mine[0].queues == ("weighted",)
    # A record not rewritten for STALE_S is a dead worker's: not read; one an hour old is dropped.
    stale, ancient = f"stale-{node}", f"ancient-{node}"
    for name, age in ((stale, capability.STALE_S + 1), (ancient, capability.FORGET_AFTER_S + 5)):
        old = json.loads(record(name, runs=True).to_json()) | {"at": seconds - age}
        client.hset(keys.capabilities(), name, json.dumps(old))
    capability.advertise(client, record(node, runs=True))
    assert {stale, ancient} & {r.node for r in capability.live(client)} == set()
    assert client.hexists(keys.capabilities(), stale) and not client.hexists(keys.capabilities(), ancient)
    capability.forget(client, node)
    capability.forget(client, stale)
    assert node not in {r.node for r in capability.live(client)}


WHY = {"from-file": "model 'weighted.bin' is not in the models dir"}


def decision(attempts: list[Attempt], records: list[WorkerCapability]):
    return decide(node="b@h", family="weighted", family_queue="weighted", ladder="weighted", why_not_here=WHY,
                  attempts=attempts, records=records)  # fmt: skip


def sent_back(times: int) -> list[Attempt]:
    return [Attempt(0, "from-file", Outcome.REROUTED) for _ in range(times)]


def test_a_job_no_worker_can_run_is_sent_back_once_to_wait_then_fails_naming_why() -> None:
    first = decision([], [record("b@h", runs=False)])
    assert first.queue == "weighted"
    assert "to wait for a worker that can run it (live workers that can: none)" in first.reason
    assert "on b@h (from-file: model 'weighted.bin' is not in the models dir)" in first.reason
    with pytest.raises(NoRungLeft, match="no live worker advertises any rung of it"):
        decision(sent_back(1), [record("b@h", runs=False)])


def test_a_job_goes_to_a_queue_only_able_workers_consume_and_not_round_for_ever() -> None:
    able = record("a@h", runs=True, queues=("weighted", "gpu0.weighted"))
    # An incapable worker that still consumes the family queue (an older farm, no record of the
    # queue left out): the job goes to the affinity queue only the able one takes.
    other = WorkerCapability("c@h", "cpu", ("weighted",), {}, (), {"weighted": {"weighted": {"from-file": "x"}}})
    chosen = decision(sent_back(1), [able, other])
    assert chosen.queue == "gpu0.weighted" and "where a@h can run it" in chosen.reason
    assert decision([], [able]).queue == "weighted"
    with pytest.raises(NoRungLeft, match=f"after {MAX_REROUTES} times sent back .* \\(able: a@h\\)"):
        decision(sent_back(MAX_REROUTES), [able, other])


LADDER = Ladder("weighted", "weighted", (rung("from-file", "read"),))


def test_run_ladder_sends_the_job_back_without_spending_a_rung(log: AttemptLog, tmp_path: Path) -> None:
    job = LadderRun(log.job_id, LADDER, weighted.FAMILY.engines, log, worker="b@h", fresh=True,
                    policies=(Availability(tmp_path),),
                    reroute=sender(LADDER, weighted.FAMILY.engines, tmp_path,
                                   lambda why, attempts: decision(attempts, [])))  # fmt: skip
    outcome = run_ladder(job, lambda *a: pytest.fail("no rung may run here"))
    assert isinstance(outcome, RetryRequest) and outcome.queue == "weighted"
    attempts, _ = log.read()
    assert [(a.outcome, a.cause, a.counted, a.worker) for a in attempts] == [("rerouted", "rerouted", False, "b@h")]
    assert current_rung(attempts) == 0  # the rung is not spent: the next worker runs it
    # Where the weights are, the same ladder runs at once, the hook never asked.
    (tmp_path / weighted.WEIGHTS).write_bytes(b"w")
    other = AttemptLog(log.client, f"{log.job_id}-2", 60)
    job = LadderRun(other.job_id, LADDER, weighted.FAMILY.engines, other, worker="a@h", fresh=True,
                    policies=(Availability(tmp_path),),
                    reroute=sender(LADDER, weighted.FAMILY.engines, tmp_path,
                                   lambda *a: pytest.fail("not asked")))  # fmt: skip
    assert run_ladder(job, lambda *a: ({"text": "hi", "weights_bytes": 1}, ())).rung == "from-file"
    log.client.delete(keys.history(other.job_id))


def test_a_record_carries_the_languages_each_rung_handles_with_this_workers_models(tmp_path: Path) -> None:
    subtitle = capability.judge_languages([registry.get("subtitle")], registry.ladders_of, tmp_path)["subtitle"]
    own = subtitle["subtitle"]
    # tiny.en is English only, told by its name; a multilingual model absent from the folder tells
    # nothing (any language: the weights check says it cannot run); pocketsphinx by its model folders.
    assert own["whisper-tiny"] == ("en",)
    assert "whisper-small" not in own
    assert own.get("pocketsphinx", ("en",)) == ("en",)
    record = WorkerCapability("cpu@h", "cpu", ("subtitle",), served=("subtitle",), languages={"subtitle": subtitle})
    back = WorkerCapability.from_json(record.to_json())
    assert back.languages == record.languages
    assert back.handles("subtitle", "subtitle", "whisper-tiny", "en")
    assert not back.handles("subtitle", "subtitle", "whisper-tiny", "fr")
    assert back.handles("subtitle", "subtitle", "whisper-small", "fr")  # declares none here: any
    assert back.handles("subtitle", "subtitle", "whisper-tiny", None)  # a job whose language is not known
    # A record from before languages were recorded reads as handling any.
    old = json.loads(record.to_json())
    del old["languages"]
    assert WorkerCapability.from_json(json.dumps(old)).handles("subtitle", "subtitle", "whisper-tiny", "fr")


def test_a_lost_gpu_is_the_reason_of_every_cuda_rung_and_of_nothing_else(tmp_path: Path) -> None:
    lost = "GPU 0 does not answer the driver (NVML: GPU is lost)"
    chaos = capability.judge_rungs([registry.get("chaos")], registry.ladders_of, tmp_path, gpu_lost=lost)["chaos"]
    fancy, gpu, plain = chaos["unavailable_first"].values()
    assert gpu == lost and plain == ""
    assert "a_package_that_is_not_installed" in fancy  # a missing package is still the first reason


def test_a_rung_whose_languages_the_request_adds_to_is_recorded_as_any(tmp_path: Path) -> None:
    tts = capability.judge_languages([registry.get("tts")], registry.ladders_of, tmp_path)["tts"]["tts"]
    # Piper's languages grow with the job's speaker (its Piper voices for other languages): a record
    # judged with no request cannot tell them, so it claims none and routing passes it any job.
    assert "piper" not in tts and registry.get("tts").engines["piper"].languages_by_request
    assert set(tts["chattts"]) == {"en", "zh"}
