"""The chaos suite (issue #10 item 7): mixed jobs on cheap rungs while the farm is hurt.

While the jobs run, the suite SIGKILLs pool children in the middle of an attempt (about one attempt
in ten), SIGKILLs one whole worker (and starts a replacement), restarts its own Redis (AOF on),
pauses a worker past the visibility timeout (on RabbitMQ: past three missed heartbeats,
FARM_BROKER_HEARTBEAT), cuts a worker's network link while Redis drops its connections (when a
veth namespace can be made and the broker is reachable through it) and, on Redis, takes a waiting
message off its list and drops it, as a ``BRPOP`` whose reply never reached a worker does.

On Redis it may run two pools that both serve the chaos family and differ in what they can run
(``two_pools``, tests/support/chaos_pools.py): each job is then sent to the queue routing chooses
(``tasks.producer.routing.choose``), a job whose next rung is the other pool's best moves there
(``routing.move``), and the worker kills take a worker of each pool in turn. Then it counts:

- submitted, terminal, succeeded per rung, failed with history;
- lost: jobs with no final state by the deadline (must be 0);
- duplicated completions: jobs whose SUCCESS was published with two different envelopes, i.e.
  the job completed twice as far as any client could see (must be 0);
- failed by infrastructure: a job revoked, or failed for anything but its design: bad input (the
  ``bad`` ladder), or every rung killed or out of memory (the suite's kills hit a short ladder's
  last rung too) (must be 0);
- history/envelope disagreements: a successful job whose attempt log in Redis is not, record for
  record and field for field, the attempts in its envelope (must be 0);
- re-runs after the end: an attempt recorded after one that ended the job (rejected, cancelled,
  error): a message back after its job's end was recorded ran again (must be 0). The suite's
  kills land on running attempts, bad inputs' included; the narrow window between a rejection's
  record and Celery storing it is made on purpose by test_kill_safety's hand-made redelivery;
- with two pools: the jobs routed to each pool and answered on each (both must be some), the
  routed jobs whose first attempt kept no route (must be 0), the jobs moved (must be some), and
  the pools none of whose workers was killed (must be none);
- a lost fetch: a job whose first message the suite dropped must be sent again by the
  lost-message sweep (``tasks.runtime.lost_messages``, its first attempt's route says so) and end;
- its own faults: every child kill it planned was made and at least one landed on a running
  attempt (settled as killed from outside), and every fault of the run was reached; a fault this
  machine cannot make (no veth namespace for the network cut) is reported as not made, never as
  an event.

Every process, server and namespace the suite starts is its own; nothing else is touched.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kombu.exceptions
import psutil
import redis

from mediafarm.config.pools import get_pool, pool_queue
from mediafarm.config.priorities import redis_lists
from mediafarm.tasks import registry
from mediafarm.tasks.producer import routing
from mediafarm.tasks.runtime.breaker import read_breakers
from mediafarm.tasks.runtime.downgrade import TERMINAL_OUTCOMES
from mediafarm.tasks.runtime.oom_killer import OUTSIDE_KILL, UNDECIDED
from mediafarm.tasks.wire import keys
from mediafarm.workers.embedded import EmbeddedRedis
from mediafarm.workers.launch import pool_environment, stop_worker, wait_ready, worker_argv
from tests.support import chaos_pools
from tests.support.chaos_pools import RoutingCounts

QUEUE = "chaos-suite"
TASK = "farm.test.chaos"
# The mix: mostly jobs that must succeed (on whichever rung), some that go down a rung by design,
# some that must fail at once (bad input: the only failures allowed).
MIX = (("steady", 0.7), ("memerr", 0.1), ("kill_once", 0.1), ("bad", 0.1))
EXPECTED_FAILURES = {"bad"}
TERMINAL = ("SUCCESS", "FAILURE", "REVOKED")
# Outcomes that may use up a ladder: the suite's own kills and the ladders' designed failures.
RESOURCE_OUTCOMES = {"oom", "killed", "timeout", "unavailable"}
JOB_SECONDS = 1.0  # each attempt of a steady job sleeps this long, so events land mid-job


@dataclass
class Report:
    broker: str
    submitted: int = 0
    terminal: int = 0
    succeeded_by_rung: Counter[str] = field(default_factory=Counter)
    # Successes on a rung below one the job never failed on (every attempt there skipped): the
    # job was sent past a rung that might have answered, which an open breaker must never do
    # to a fallback. A job whose every rung above was killed under it reaches its rung honestly.
    succeeded_past_unfailed: Counter[str] = field(default_factory=Counter)
    failed_with_history: int = 0
    # Attempts settled as worker_lost (their worker died, paused or was cut off), by worker node:
    # shows which of the faults made jobs run again.
    lost_by_worker: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    infrastructure_failures: list[str] = field(default_factory=list)
    disagreements: list[str] = field(default_factory=list)
    reruns_after_end: list[str] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)  # faults the run ended too soon for
    unmade: list[str] = field(default_factory=list)  # faults this machine cannot make, and why
    children_planned: int = 0
    children_killed: int = 0
    # Attempts settled as killed from outside (tasks.runtime.oom_killer): the suite's child kills that hit a job.
    attempts_killed_from_outside: int = 0
    # Terminal states by ladder (``ladder/STATUS``), and what the rung breakers did (tasks.runtime.attribution):
    # failures counted against a rung, rungs skipped because a breaker was open, breakers open at the end.
    ended_by_ladder: Counter[str] = field(default_factory=Counter)
    counted_failures: int = 0
    skipped_by_breaker: int = 0
    breakers_open_at_end: list[str] = field(default_factory=list)
    # With two pools: what the run showed of routing.
    routing: RoutingCounts | None = None
    # Jobs whose message was lost in kombu's fetch and sent again by the lost-message sweep
    # (``tasks.runtime.lost_messages``), known by the note their first attempt's route keeps.
    resent_by_sweep: int = 0
    # Messages the suite took off a list and dropped (a lost fetch); a job's first message, or a later one.
    fetches_lost: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        return [
            f"{name}: {values[:5]}{' ...' if len(values) > 5 else ''}"
            for name, values in (("lost", self.lost), ("duplicated completions", self.duplicated),
                                 ("failed by infrastructure", self.infrastructure_failures),
                                 ("history/envelope disagreements", self.disagreements),
                                 ("re-runs after the end was recorded", self.reruns_after_end),
                                 ("faults not reached (the run ended first)", self.missed),
                                 ("child kills that hit no running attempt", self._kills_unseen()),
                                 ("first messages dropped, none sent again by the sweep", self._fetches_unseen()),
                                 *(self.routing.problems() if self.routing else ()))  # fmt: skip
            if values
        ]

    def _fetches_unseen(self) -> list[str]:
        firsts = [j for j in self.fetches_lost if " " not in j]
        return firsts if firsts and not self.resent_by_sweep else []

    def _kills_unseen(self) -> list[str]:
        if self.children_killed and not self.attempts_killed_from_outside:
            return [f"{self.children_killed} children SIGKILLed, no attempt settled as killed from outside"]
        return []

    def text(self) -> str:
        rungs = ", ".join(f"{rung}: {n}" for rung, n in sorted(self.succeeded_by_rung.items()))
        return "\n".join([
            f"chaos suite on {self.broker}",
            f"  submitted {self.submitted}, terminal {self.terminal}",
            f"  succeeded per rung: {rungs}",
            f"  failed with history: {self.failed_with_history}",
            f"  attempts settled as worker_lost, by worker: {dict(self.lost_by_worker) or 'none'}",
            f"  children SIGKILLed mid-attempt: {self.children_killed} of {self.children_planned} planned; settled as "
            f"killed from outside: {self.attempts_killed_from_outside}",
            f"  ended by ladder: {dict(sorted(self.ended_by_ladder.items()))}",
            f"  rung breakers: {self.counted_failures} failures counted against a rung, {self.skipped_by_breaker} "
            f"rungs skipped as open, open at the end: {self.breakers_open_at_end or 'none'}",
            *([self.routing.text()] if self.routing else []),
            f"  messages lost in the broker's fetch and sent again by the sweep: {self.resent_by_sweep}",
            f"  lost: {len(self.lost)}  duplicated completions: {len(self.duplicated)}  "
            f"failed by infrastructure: {len(self.infrastructure_failures)}  "
            f"history/envelope disagreements: {len(self.disagreements)}  "
            f"re-runs after the end was recorded: {len(self.reruns_after_end)}",
            *(f"  event: {e}" for e in self.events),
            *(f"  not made here: {u}" for u in self.unmade),
            *(f"  not reached: {m}" for m in self.missed),
        ])  # fmt: skip


class SuccessWatch(threading.Thread):
    """Every SUCCESS the result backend publishes, per job (reconnects through a Redis restart)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.successes: dict[str, set[str]] = {}
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                client = redis.Redis.from_url(self.url)
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.psubscribe("celery-task-meta-*")
                while not self._stop_event.is_set():
                    message = pubsub.get_message(timeout=0.2)
                    if message is not None:
                        self._record(message["data"])
            except redis.RedisError:
                time.sleep(0.2)

    def _record(self, data: bytes) -> None:
        meta = json.loads(data)
        if meta.get("status") == "SUCCESS":
            result = meta.get("result") or {}
            # The same envelope stored again (a redelivery answered from the stored result) is
            # one completion; a different one means the job completed twice.
            self.successes.setdefault(meta["task_id"], set()).add(json.dumps(result.get("attempts"), sort_keys=True))

    def stop(self) -> None:
        self._stop_event.set()


@dataclass
class Worker:
    node: str
    pool: str
    process: subprocess.Popen[bytes]
    log: Path
    inside_namespace: bool = False
    paused: bool = False


class ChaosSuite:
    """One run of the suite. ``broker_url``: the broker the workers and the producer use;
    ``redis_server``: the suite's own Redis (the result backend, and the broker when it is Redis);
    ``link``: a veth link (``tests.support.netns``) for the worker whose network is cut, or None;
    ``two_pools``: the pools of tests.support.chaos_pools (Redis only) instead of ``chaos`` alone."""

    def __init__(
        self, *, producer: Any, broker_url: str, redis_server: EmbeddedRedis, workdir: Path, env: dict[str, str],
        jobs: int, link: Any = None, broker_name: str = "redis", inside_broker_url: str = "",
        mix: tuple[tuple[str, float], ...] = MIX, kill_share: float = 0.1, send_rate: float | None = None,
        two_pools: bool = False,
    ) -> None:  # fmt: skip
        self.producer, self.broker_url, self.redis_server = producer, broker_url, redis_server
        # How the namespaced worker reaches the broker: the broker's URL on the link's host address
        # unless told (a RabbitMQ on loopback is reached through a forwarder, tests.support.netns).
        self.inside_broker_url = inside_broker_url
        self.workdir, self.jobs, self.link = workdir, jobs, link
        # The ladders sent and their shares; the share of jobs whose child the suite SIGKILLs mid-attempt.
        self.mix, self.kill_share = mix, kill_share
        # Jobs sent a second, as traffic arrives (the child kills paced with them); None: all at once.
        # Arriving jobs meet a breaker as it changes, and a killed job's retry is not behind the whole run.
        self.send_rate = send_rate
        self.report = Report(broker_name, routing=RoutingCounts() if two_pools else None)
        self.is_redis_broker = broker_name == "redis"
        # Two pools: workers take the family's queue and their pool's own, and jobs are routed. The
        # orphan sweep that keeps a dead pool's queue from holding jobs is Redis-only (tasks.runtime.orphans).
        self.routed, self.pools = two_pools, chaos_pools.POOLS if two_pools else ("chaos",)
        if two_pools:
            if not self.is_redis_broker:
                raise ValueError("two pools are run on a Redis broker only")
            env = {**env, "FARM_ROUTE_SPILL_DEPTH": str(chaos_pools.SPILL_DEPTH)}
        self.env = env
        self.sent_to: dict[str, str] = {}  # job -> the pool routing sent it to
        self.workers_killed = 0
        self.visibility = float(env.get("FARM_VISIBILITY_TIMEOUT", "10"))
        self.heartbeat = float(env.get("FARM_BROKER_HEARTBEAT", "120"))
        self.workers: list[Worker] = []
        self.client = redis.Redis.from_url(redis_server.url, socket_timeout=5)
        self.random = random.Random(jobs)
        # Second halves of faults (resume a paused worker, bring a link up), run by the main loop
        # when due, so jobs go on being watched and children killed meanwhile.
        self._later: list[tuple[float, Callable[[], None]]] = []

    def after(self, seconds: float, action: Callable[[], None]) -> None:
        self._later.append((time.monotonic() + seconds, action))

    def _run_due(self, everything: bool = False) -> None:
        now = time.monotonic()
        due = [item for item in self._later if everything or item[0] <= now]
        self._later = [item for item in self._later if item not in due]
        for _, action in sorted(due, key=lambda item: item[0]):
            action()

    # --- workers -------------------------------------------------------------------------------

    def start_worker(self, pool: str, *, inside_namespace: bool = False) -> Worker:
        node = f"suite-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
        env = dict(self.env)
        if self.routed:
            env["FARM_MODELS_DIR"] = str(chaos_pools.models_dir(self.workdir, pool))
        queues = [registry.get(chaos_pools.FAMILY).queue] if self.routed else [QUEUE]
        argv = worker_argv(get_pool(pool), queues=queues, concurrency=2, node=node, loglevel="INFO")
        if inside_namespace:
            backend = self.redis_server.url.replace("127.0.0.1", self.link.host_address)
            broker = self.inside_broker_url or self.broker_url.replace("127.0.0.1", self.link.host_address)
            env.update(FARM_BROKER_URL=broker, FARM_RESULT_BACKEND=backend)
            argv = self.link.command(argv)
        log = self.workdir / f"{node.split('@')[0]}.log"
        with log.open("wb") as fh:
            process = subprocess.Popen(argv, env=pool_environment(get_pool(pool), env), stdin=subprocess.DEVNULL,
                                       stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        self._wait_ready(node, process)
        worker = Worker(node, pool, process, log, inside_namespace)
        self.workers.append(worker)
        return worker

    def _wait_ready(self, node: str, process: subprocess.Popen[bytes], timeout: float = 90) -> None:
        # A replacement started right after Redis restarted (events due together run back to back)
        # is pinged on the producer's dead pooled connection: that ping raises, the next reconnects.
        deadline = time.monotonic() + timeout
        while True:
            try:
                return wait_ready(self.producer, node, process, timeout=max(1.0, deadline - time.monotonic()))
            except (redis.RedisError, kombu.exceptions.OperationalError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def stop_workers(self) -> None:
        for worker in self.workers:
            if worker.paused:
                os.killpg(worker.process.pid, signal.SIGCONT)
            stop_worker(worker.process, timeout=30)

    def _live(self) -> list[Worker]:
        return [w for w in self.workers if w.process.poll() is None and not w.paused]

    # --- the run -------------------------------------------------------------------------------

    def run(self) -> Report:
        watch = SuccessWatch(self.redis_server.url)
        watch.start()
        for pool in self.pools if self.routed else self.pools * 2:
            self.start_worker(pool)
        if self.link is not None:
            self.start_worker(self.pools[0], inside_namespace=True)
        if self.routed:
            chaos_pools.wait_for_records(self.client)
        ladders = self._ladders()
        jobs: dict[str, str] = {}
        total, started = len(ladders), time.monotonic()
        self._send(jobs, ladders, total if self.send_rate is None else 1)
        events: list[tuple[float, Callable[[], None]]] = [
            (0.15, self.kill_a_worker), (0.3, self.restart_redis), (0.45, self.cut_a_link), (0.6, self.pause_a_worker),
        ]
        if self.routed:  # the second pool's worker killed too
            events.append((0.75, self.kill_a_worker))
        if self.is_redis_broker:  # a fetch whose reply is lost (RabbitMQ acks per delivery: no such window)
            events.append((0.35, self.lose_a_fetch))
        events.sort(key=lambda event: event[0])
        kills_due, kills_done = max(1, round(total * self.kill_share)), 0
        deadline = time.monotonic() + 120 + total * JOB_SECONDS
        states: dict[str, dict[str, Any]] = {}
        try:
            while time.monotonic() < deadline:
                if self.send_rate is not None:
                    self._send(jobs, ladders, int((time.monotonic() - started) * self.send_rate) + 1)
                states = self._states(jobs) or states
                done = sum(1 for s in states.values() if s.get("status") in TERMINAL)
                if done == total:
                    break
                self._run_due()
                while events and done >= events[0][0] * total:
                    events.pop(0)[1]()
                paced = kills_due if self.send_rate is None else kills_due * len(jobs) / total
                if kills_done < min(kills_due, paced) and self.random.random() < 0.3:
                    kills_done += self.kill_a_child([j for j in jobs if states.get(j, {}).get("status") not in TERMINAL])
                time.sleep(0.25)
            self.report.submitted = len(jobs)
            for _, event in events:  # whatever the run finished too fast for
                self.report.missed.append(event.__name__)
            self.report.children_planned, self.report.children_killed = kills_due, kills_done
            if kills_done < kills_due:
                self.report.missed.append(f"child kills: {kills_done} of {kills_due} made")
            time.sleep(1.0)  # the last publishes reach the watch
        finally:
            self._run_due(everything=True)
            watch.stop()
            self.stop_workers()
            self.client.close()
        self.client = redis.Redis.from_url(self.redis_server.url)
        self._count(jobs, self._states(jobs), watch)
        self.report.breakers_open_at_end = [f"{s.ladder}/{s.rung} {s.state}" for s in read_breakers(self.client)]
        self.client.close()
        return self.report

    def _send(self, jobs: dict[str, str], ladders: list[str], upto: int) -> None:
        """Send the jobs of ``ladders`` up to the ``upto``-th that are not sent yet."""
        while len(jobs) < min(upto, len(ladders)):
            ladder = ladders[len(jobs)]
            try:
                route = chaos_pools.route(self.client, ladder) if self.routed else None
                sent = self.producer.send_task(TASK, kwargs={"ladder": ladder, "plan": {"sleep": JOB_SECONDS}},
                                               **self._where(route))  # fmt: skip
            except Exception:  # noqa: BLE001 - the broker is restarting: the next round sends it
                return
            jobs[sent.id] = ladder
            if route is not None:
                self.sent_to[sent.id] = route.pool

    def _where(self, route: routing.Route | None) -> dict[str, Any]:
        """send_task's queue and headers: the route's, the family's queue when no pool is live, or
        the suite's own queue with one pool."""
        if route is not None:
            return {"queue": route.queue, "headers": {routing.ROUTE_HEADER: route.reason}}
        return {"queue": registry.get(chaos_pools.FAMILY).queue if self.routed else QUEUE}

    def _ladders(self) -> list[str]:
        ladders = [name for name, share in self.mix for _ in range(max(1, round(share * self.jobs)))]
        self.random.shuffle(ladders)
        return ladders[: self.jobs]

    def _states(self, jobs: dict[str, str]) -> dict[str, dict[str, Any]]:
        try:
            raw = self.client.mget([f"celery-task-meta-{job}" for job in jobs])
        except redis.RedisError:  # restarting: keep the last reading
            return {}
        return {job: json.loads(r) if r else {} for job, r in zip(jobs, raw)}

    # --- the faults ----------------------------------------------------------------------------

    def kill_a_child(self, unfinished: list[str]) -> bool:
        """SIGKILL a pool child of a running worker while it runs an attempt of one of the jobs
        (an idle child's death would test nothing); False when none is running one now."""
        children = {c for w in self._live() for c in _pool_children(w.process.pid)}
        busy = [pid for pid in self._running_pids(unfinished) if pid in children]
        if not busy:
            return False
        try:
            os.kill(self.random.choice(busy), signal.SIGKILL)
        except ProcessLookupError:  # it ended since it was listed (recycled, or its pool restarted)
            return False
        return True

    def _running_pids(self, unfinished: list[str]) -> list[int]:
        """Children that hold an open attempt of these jobs (their newest attempt record)."""
        pipe = self.client.pipeline(transaction=False)
        for job in unfinished:
            pipe.lindex(keys.history(job), -1)
        try:
            newest = pipe.execute()
        except redis.RedisError:  # restarting: no kill this time
            return []
        return [record["pid"] for record in map(json.loads, filter(None, newest)) if record.get("outcome") is None]

    def kill_a_worker(self) -> None:
        """SIGKILL a whole worker and start another of its pool; with two pools, each kill takes the
        next pool's worker (one paused just now is not live: then another's)."""
        pool = self.pools[self.workers_killed % len(self.pools)]
        candidates = [w for w in self._live() if not w.inside_namespace]
        victim = next((w for w in candidates if w.pool == pool), candidates[0])
        os.killpg(victim.process.pid, signal.SIGKILL)
        victim.process.wait(10)
        self.workers_killed += 1
        if self.report.routing is not None:
            self.report.routing.workers_killed[victim.pool] += 1
        self.start_worker(victim.pool)
        self.report.events.append(f"worker {victim.node} (pool {victim.pool}) SIGKILLed whole; a replacement started")

    def lose_a_fetch(self, tries: int = 20) -> None:
        """Take a waiting job's message off its list and drop it, as a ``BRPOP`` whose reply never
        reached its worker does (``tasks.runtime.lost_messages``): the job must end all the same."""
        queues = [QUEUE] if not self.routed else [registry.get(chaos_pools.FAMILY).queue,
                                                  *(pool_queue(p, registry.get(chaos_pools.FAMILY).queue)
                                                    for p in self.pools)]  # fmt: skip
        for name in (n for q in queues for n in redis_lists(q)):
            raw = self.client.rpop(name)
            if raw is not None:
                job_id = json.loads(raw)["headers"]["id"]
                first = not self.client.exists(keys.history(job_id))
                self.report.fetches_lost.append(job_id if first else f"{job_id} (a later message)")
                self.report.events.append(f"message of job {job_id} taken off {name!r} and dropped (a lost fetch)")
                return
        if tries:
            self.after(0.5, lambda: self.lose_a_fetch(tries - 1))
        else:
            self.report.unmade.append("lost fetch (no message was waiting in a queue to take)")

    def restart_redis(self) -> None:
        self.redis_server.restart(down_for=2.0)
        self.report.events.append("Redis restarted (down 2 s, AOF on)")

    def pause_a_worker(self) -> None:
        """SIGSTOP a worker (main process and children) long enough for its jobs to go elsewhere:
        past the visibility timeout on Redis; on RabbitMQ past a few missed heartbeats, after
        which the broker drops its connection and hands its unacked jobs to another worker."""
        # The first pool's: the second's is the next worker killed.
        candidates = [w for w in self._live() if not w.inside_namespace]
        victim = next((w for w in candidates if w.pool == self.pools[0]), candidates[0])
        victim.paused = True
        os.killpg(victim.process.pid, signal.SIGSTOP)

        def resume() -> None:
            os.killpg(victim.process.pid, signal.SIGCONT)
            victim.paused = False

        if self.is_redis_broker:
            seconds, past = self.visibility + 4, "the visibility timeout"
        else:
            seconds, past = 3 * self.heartbeat + 4, f"three {self.heartbeat:g} s heartbeats"
        self.after(seconds, resume)
        self.report.events.append(f"worker {victim.node} (pool {victim.pool}) paused {seconds:g} s, past {past}")

    def cut_a_link(self) -> None:
        if self.link is None:
            self.report.unmade.append("network cut (no veth namespace here, or no broker reachable through one)")
            return
        self.link.down()

        def drop_connections() -> None:
            for client in self.client.client_list():
                if client["addr"].startswith(f"{self.link.worker_address}:"):
                    self.client.client_kill(client["addr"])

        # Redis drops the worker's connections at once (as after a TCP keepalive timeout); RabbitMQ
        # drops its own after missed heartbeats, so the cut lasts past three of them there.
        seconds = 5.0 if self.is_redis_broker else 3 * self.heartbeat + 2
        self.after(1, drop_connections)
        self.after(seconds, self.link.up)
        self.report.events.append(f"network of the namespaced worker cut {seconds:g} s; Redis dropped its connections")

    # --- the counts ----------------------------------------------------------------------------

    def _count(self, jobs: dict[str, str], states: dict[str, dict[str, Any]], watch: SuccessWatch) -> None:
        report = self.report
        pool_of = {w.node: w.pool for w in self.workers}
        if report.routing is not None:
            report.routing.routed_to.update(self.sent_to.values())
        for job, ladder in jobs.items():
            meta = states.get(job) or {}
            status = meta.get("status")
            history = [json.loads(r) for r in self.client.lrange(keys.history(job), 0, -1)]
            if status not in TERMINAL:
                report.lost.append(f"{job} ({ladder}, {status or 'no state'})")
                continue
            report.terminal += 1
            report.ended_by_ladder[f"{ladder}/{status}"] += 1
            attempts = meta["result"]["attempts"] if status == "SUCCESS" else history
            report.counted_failures += sum(1 for a in attempts if a.get("counted") is True)
            report.skipped_by_breaker += sum(
                1 for a in attempts if a.get("outcome") == "skipped" and str(a.get("reason")).startswith("breaker")
            )
            report.lost_by_worker.update(a.get("worker", "?") for a in attempts if a.get("outcome") == "worker_lost")
            report.attempts_killed_from_outside += sum(1 for a in attempts if _killed_from_outside(a))
            report.resent_by_sweep += any("lost-message sweep" in str(a.get("route", "")) for a in attempts)
            if report.routing is not None:
                report.routing.count(job, attempts, job in self.sent_to, pool_of)
            ended = next((i for i, a in enumerate(history) if a.get("outcome") in TERMINAL_OUTCOMES), None)
            if ended is not None and ended < len(history) - 1:
                report.reruns_after_end.append(f"{job} ({ladder}): {[a.get('outcome') for a in history]}")
            if len(watch.successes.get(job, ())) > 1:
                report.duplicated.append(f"{job} ({ladder})")
            if status == "SUCCESS":
                envelope = meta["result"]
                report.succeeded_by_rung[f"{ladder}/{envelope['rung']}"] += 1
                lost_on = RESOURCE_OUTCOMES | {"stalled"}
                failed_on = {a.get("rung_index") for a in history if a.get("outcome") in lost_on}
                if any(rung not in failed_on for rung in range(int(envelope.get("rung_index", 0)))):
                    report.succeeded_past_unfailed[f"{ladder}/{envelope['rung']}"] += 1
                problem = _disagreement(history, envelope["attempts"])
                if problem:
                    report.disagreements.append(f"{job} ({ladder}): {problem}")
            else:
                if history:
                    report.failed_with_history += 1
                if not _failed_by_design(ladder, status, meta.get("result") or {}, history):
                    report.infrastructure_failures.append(f"{job} ({ladder}, {status}: {meta.get('result')})")


def short_limits_config(target: Path, soft: int = 6, hard: int = 7) -> Path:
    """The test farm configuration with short time limits for every family (default soft 6 s, hard 7 s),
    written to ``target``: what a 10 s visibility timeout requires, or workers refuse to start."""
    base = (Path(__file__).parent / "farm-test.toml").read_text()
    short = base.replace("[limits.chaos]\nsoft = 60\nhard = 90", f"[limits.chaos]\nsoft = {soft}\nhard = {hard}")
    target.write_text(short + short_limits_toml(but="chaos", soft=soft, hard=hard))
    return target


def short_limits_toml(but: str, soft: int = 6, hard: int = 7) -> str:
    """``[limits.NAME]`` blocks (default soft 6 s, hard 7 s) for every registered family but ``but``."""
    from mediafarm.tasks import registry

    return "".join(f"\n[limits.{name}]\nsoft = {soft}\nhard = {hard}\n" for name in registry.load() if name != but)


def _failed_by_design(ladder: str, status: str, error: dict[str, Any], history: list[dict[str, Any]]) -> bool:
    if status != "FAILURE":
        return False
    if ladder in EXPECTED_FAILURES:
        return True
    outcomes = [a.get("outcome") for a in history]
    # A move spends no rung: a ladder used up by kills on two pools is used up all the same.
    return error.get("exc_type") == "NoRungLeft" and bool(outcomes) and set(outcomes) <= RESOURCE_OUTCOMES | {"moved"}


def _killed_from_outside(attempt: dict[str, Any]) -> bool:
    """Settled as a child SIGKILLed by neither the watchdog nor the kernel's OOM killer (or with no
    OOM-kill count to tell, where the machine keeps none)."""
    reason = attempt.get("reason") or ""
    return attempt.get("outcome") == "killed" and reason.startswith((OUTSIDE_KILL, UNDECIDED))


def _pool_children(main_pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(main_pid).children(recursive=True)]
    except psutil.Error:
        return []


def _disagreement(history: list[dict[str, Any]], attempts: list[dict[str, Any]]) -> str:
    """What differs between the attempt log and the envelope's attempts ('' when they agree).

    Storing a job's SUCCESS makes its log the envelope's attempts (``tasks.result_backend``) and
    nothing may change it afterwards, so they must be equal record for record, field for field."""
    if len(history) != len(attempts):
        return f"{len(history)} attempts in the log, {len(attempts)} in the envelope"
    for i, (logged, enveloped) in enumerate(zip(history, attempts)):
        for key in sorted(set(logged) | set(enveloped)):
            if logged.get(key) != enveloped.get(key):
                return f"attempt {i}: {key} {logged.get(key)!r} in the log, {enveloped.get(key)!r} in the envelope"
    return ""
