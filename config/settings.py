"""Typed settings read from the environment (prefix ``FARM_``).

Every knob an operator turns lives here, with its default written down, so that nothing
about the farm depends on an undocumented Celery default.
"""

from __future__ import annotations

import base64
import binascii
import functools
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from mediafarm.config.storage_url import S3Place


def default_storage_dir() -> Path:
    """``$XDG_DATA_HOME/mediafarm/storage``, else ``~/.local/share/mediafarm/storage`` (the XDG base
    directory rules: a relative XDG_DATA_HOME is ignored). A process without a home folder (a
    container user with no passwd entry) falls back to ``./storage``, as before."""
    data_home = os.environ.get("XDG_DATA_HOME", "")
    if data_home and Path(data_home).is_absolute():
        return Path(data_home) / "mediafarm" / "storage"
    try:
        return Path.home() / ".local" / "share" / "mediafarm" / "storage"
    except RuntimeError:
        return Path.cwd() / "storage"


class FarmSettings(BaseSettings):
    """Settings of one farm process (producer, worker or CLI).

    Attributes:
        broker_url: Celery broker: Redis (``redis://``) or RabbitMQ (``amqp://``). Empty means
            "none configured": ``farm up`` then starts an embedded Redis, and everything else
            refuses to guess.
        result_backend: Where results and attempt histories live: always a Redis. Defaults to
            the broker, so a RabbitMQ farm must set it.
        media_roots: Inputs must resolve (symlinks followed) inside one of these folders.
        media_urls: Where a job's media may be fetched from when its request names an http(s) URL
            instead of a path, comma-separated: host names, IP addresses or networks (CIDR), or
            ``*`` for any host with public addresses. An address that is not public (loopback,
            link-local, private ...) is reached only when its network is listed, whatever names
            the host (``loopback`` lists 127.0.0.0/8 and ::1). ``s3://bucket[/prefix]`` lists a
            bucket of the object store (only such an entry does). Empty (the default): media is
            read from the media roots only.
        media_url_max_mb: The largest media a worker fetches by URL; a larger one rejects the job.
        media_url_timeout: Seconds a worker waits on a media URL's host for each connect and read.
        storage_dir: Artifacts of a job go under ``<storage_dir>/<job id>/``. Default: the user's
            data folder, ``$XDG_DATA_HOME/mediafarm/storage`` (``~/.local/share/mediafarm/storage``
            when XDG_DATA_HOME is unset), so every process of a farm run by one user (``farm up``,
            its workers, ``farm submit``, a producer) finds the same folder whatever folder it was
            started in. A relative FARM_STORAGE_DIR is taken from the working folder of the process
            that reads it, once, as it starts (``farm up`` hands its workers the absolute path).
            Workers on other machines or in containers must share one folder and name it here,
            unless the farm keeps its artifacts in an object store (``storage_url``).
        storage_url: ``s3://bucket/prefix`` on any S3-compatible store (AWS S3, MinIO, Ceph RGW,
            SeaweedFS): a succeeded attempt copies its artifacts there, and downloads and the
            gateway read them from there, so hosts share no folder (``tasks.wire.object_store``).
            The endpoint and credentials are the standard AWS settings (``AWS_ENDPOINT_URL``,
            ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, profiles, roles). Empty (the default):
            artifacts are read from ``storage_dir``. Checkpoints are copied there too, so a job
            resumes on another host. Each worker still writes a job's files in its own
            ``storage_dir`` first; live outputs (speech chunks, live subtitles) are read from there.
        artifact_delivery: How the gateway serves an artifact kept in the object store: ``stream``
            (through the gateway, Range and ETag kept) or ``redirect`` (a 307 to a presigned URL
            valid ``presign_seconds``).
        presign_seconds: How long a presigned artifact URL stays valid.
        models_dir: Local model weights (nothing is downloaded at run time).
        visibility_timeout: Seconds Redis waits before redelivering an unacked job. Must exceed
            every hard time limit, or a long job is delivered twice while it still runs.
        consumer_timeout: RabbitMQ's ``consumer_timeout`` in seconds, as the broker is
            configured (rabbitmq.conf; RabbitMQ's default is 1800). A job unacked longer than this
            makes RabbitMQ close the worker's channel and deliver it again, so it must exceed the
            hard time limit of every family the worker consumes. A client cannot read it from
            the broker: the operator states it here, and the worker checks against it.
        restore_interval: Seconds between two sweeps in which a worker hands back the unacked
            jobs of dead workers whose visibility timeout has passed (kombu's default sweep is
            every 100 s; ours scans every ``restore_interval``).
        handback_grace: Seconds a Redis worker may be silent (no heartbeat, ``workers.handback``)
            before a live worker hands the jobs it was running back to their queue; 0 turns the
            handback off (its jobs then come back after ``visibility_timeout``). Must be well above
            the one-second heartbeat: a worker whose main process runs keeps beating while its
            children work, so only a dead, paused or cut-off worker is passed over.
        lost_sweep: Redis: seconds between two looks for job messages lost in kombu's fetch (taken
            off their queue, the reply lost to a Redis restart or a network cut before the worker
            recorded them unacked), and the least age of a message looked for; one found nowhere
            at two looks is sent again under its id (``tasks.sent_ledger``, ``tasks.runtime.lost_messages``).
            0: off, and producers record nothing.
        soft_shutdown_timeout: Seconds a cold-shutting-down worker waits for running jobs before
            handing their messages back to the queue (Celery's ``worker_soft_shutdown_timeout``).
        drain_seconds: Seconds a draining worker (``farm drain``, SIGTERM: ``workers.drain``) lets its
            running jobs go on before it hands them back to their queue, checkpoints kept. Default
            300: under the cluster autoscaler's 10-minute limit on a pod's termination, leaving the
            rest of the pod's grace period for the handback and the exit.
        drain_on_sigterm: SIGTERM drains the worker (what an orchestrator's stop expects: bounded,
            exit 0); false gives Celery's warm shutdown back (it waits for running jobs without end).
        retry_delay: Seconds before a job that lost a rung runs again (Celery's per-task default
            is 180 s, far too long for a downgrade).
        transient_retries: Same-rung retries allowed for errors that are nobody's fault
            (a broker hiccup, a worker that died under a job it did not cause).
        watchdog_interval: Seconds between two RSS polls of the pool children.
        checkpoint_interval: Seconds between two checkpoints of a resuming family's job at most
            (``tasks.wire.checkpoint``): a lost attempt costs about this much work plus its last unit.
        config_file: Optional TOML file that overrides the declared pools and ladders.
        metrics_port: Port of the worker's Prometheus endpoint (jobs, kills, queues ...); 0 turns it off.
        gateway_metrics_open: Serve the gateway's ``GET /metrics`` without a bearer token even when
            FARM_API_TOKENS is set (a scraper on a private network); by default it asks for one.
        pool: The pool (``config.pools``) this worker process serves; sets its caps.
        routing: Route each job to the pool whose live workers run the best rung of its ladder
            (``tasks.producer.routing``): at submit, to that pool's own queue of the family; at a delivery,
            to another pool's queue when the next rung is that pool's best (a GPU job killed for
            memory whose next rung is the CPU pool's). Off: every job goes to its family's queue
            and runs its whole ladder on whichever worker takes it.
        route_spill_depth: Jobs waiting in the best pool's queue at which a new job starts lower,
            on the first pool down the ladder whose queue holds fewer (and a job about to move
            stays where it is); 0: never, every job waits for the best pool.
        wake_pools: The pools an orchestrator scales from zero (a KEDA ``ScaledObject`` with
            ``minReplicaCount: 0``), comma-separated: while one has no live worker, a job it would
            start on a better rung than routing chose counts as wanting it (``tasks.producer.wake``). Empty:
            none; a pool not listed is never woken by the jobs it would run better, only by those
            waiting in its queues.
        wake_window: Seconds a job counts as wanting a pool of ``wake_pools``: while such jobs were
            submitted within it, the pool's load reads at least 1, one replica to start. Keep it
            shorter than the scaler's idle time before it takes the last replica (KEDA's
            ``cooldownPeriod``); 0: no job wakes a pool.
        family_modules: Modules that declare job families beyond the built-in ones (a plugin's,
            a test's), each with a module-level ``FAMILY``; separated like PATH. Every process of
            a farm (workers, producers, CLI) must name the same ones.
        foreign_queue: Celery's default queue (``celery``), where a client with no farm
            configuration puts a task it names no queue for. Every worker takes it and sends each
            farm task on to its family's queue, and fails any other task naming the farm's
            (``workers.foreign``). Empty: not consumed, for a broker shared with another Celery
            app that uses its default queue.
        api_tokens: Bearer tokens the HTTP gateway accepts (``farm gateway``), comma-separated.
            Empty: the gateway serves loopback clients only, without a token, and refuses to listen
            on any other address.
        gateway_host: Where ``farm gateway`` listens (``farm up`` always uses loopback).
        gateway_port: Its port (``farm up`` takes a free one if this one is taken).
        cors_origins: Origins a browser page may call the gateway from, comma-separated; empty
            (the default) sends no CORS headers at all.
        uploads_dir: Where the gateway keeps uploaded media (``POST /v1/uploads``). Default:
            ``<storage_dir>/.uploads`` (a name no job folder can have). Always one of the input
            roots (:attr:`input_roots`), so a worker reads an upload like any media file.
        upload_max_mb: The largest upload the gateway takes, in MB (10^6 bytes).
        upload_max_count: Uploads one token (or, without tokens, all loopback clients) may hold at
            once; an upload goes when the results of its jobs expire (``farm gc``).
        room_max_lines: Lines one dialogue room of the gateway holds in flight (accepted, audio not
            yet wholly sent); a line past it is answered ``busy`` (docs/gateway.md, rooms).
        room_linger_s: Seconds a dropped room connection's unfinished lines wait for the client to
            connect again and send them again before they are cancelled.
        webhook_secret: The farm's webhook signing secrets (Standard Webhooks: ``whsec_`` + base64),
            separated by spaces. Each delivery is signed by every one, so during a rotation the old
            and the new sign at once and a receiver that knows either verifies (docs/operating.md,
            Webhooks). Only the webhook dispatcher (every worker starts one) needs it.
        webhook_allow: Hosts and networks (CIDR) a webhook may be posted to although they are
            loopback, link-local or private, comma-separated; empty: public addresses only.
        webhook_retry_schedule: Seconds between a failed try of a webhook event and the next,
            comma-separated: the job's ``completed`` event is tried once, then once after each
            (the default, Standard Webhooks' reference schedule, spans about 27.6 h); every other
            event only after the first two, so a dead receiver does not hold up the final event.
        webhook_progress_s: A job's ``progress`` webhook events come at most this often.
        webhook_senders: Deliveries one webhook dispatcher makes at once (a slow receiver holds one).
        webhook_dispatch: Does ``farm worker`` start a webhook dispatcher beside itself (off: deliver
            with ``farm webhooks serve`` elsewhere)?
        public_url: The gateway's address as webhook receivers reach it (``https://farm.example``):
            the base of the links in a webhook's payload; empty: the links are relative paths.
    """

    model_config = SettingsConfigDict(env_prefix="FARM_", extra="ignore")

    broker_url: str = ""
    result_backend: str = ""
    media_roots: Annotated[list[Path], NoDecode] = Field(default_factory=lambda: [Path.cwd()])
    media_urls: Annotated[list[str], NoDecode] = Field(default_factory=list)
    media_url_max_mb: int = Field(4096, ge=1)
    media_url_timeout: float = Field(30.0, gt=0)
    storage_dir: Path = Field(default_factory=default_storage_dir)
    storage_url: str = ""
    artifact_delivery: Literal["stream", "redirect"] = "stream"
    presign_seconds: int = Field(900, ge=1, le=7 * 24 * 3600)
    models_dir: Path = Field(default_factory=lambda: Path.cwd() / "models")
    visibility_timeout: int = 7200
    consumer_timeout: int = 1800
    broker_heartbeat: float = 120.0
    restore_interval: int = 10
    handback_grace: float = Field(30.0, ge=0)
    lost_sweep: float = Field(30.0, ge=0)
    soft_shutdown_timeout: float = 60.0
    drain_seconds: float = Field(300.0, ge=0)
    drain_on_sigterm: bool = True
    retry_delay: float = 0.0
    transient_retries: int = 2
    watchdog_interval: float = 0.05
    checkpoint_interval: float = Field(5.0, gt=0)
    config_file: Path | None = None
    pool: str = "cpu"
    routing: bool = True
    route_spill_depth: int = Field(4, ge=0)
    wake_pools: Annotated[list[str], NoDecode] = Field(default_factory=list)
    wake_window: float = Field(120.0, ge=0)
    metrics_port: int = 0
    gateway_metrics_open: bool = False
    family_modules: Annotated[list[str], NoDecode] = Field(default_factory=list)
    foreign_queue: str = "celery"
    api_tokens: Annotated[list[str], NoDecode] = Field(default_factory=list)
    gateway_host: str = "127.0.0.1"
    gateway_port: int = Field(8000, ge=0, le=65535)
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    uploads_dir: Path | None = None
    upload_max_mb: float = Field(512.0, gt=0)
    upload_max_count: int = Field(100, ge=1)
    room_max_lines: int = Field(8, ge=1, le=1000)
    room_linger_s: float = Field(10.0, ge=0, le=3600)
    webhook_secret: Annotated[list[str], NoDecode] = Field(default_factory=list)
    webhook_allow: Annotated[list[str], NoDecode] = Field(default_factory=list)
    webhook_retry_schedule: Annotated[list[float], NoDecode] = Field(
        default_factory=lambda: [5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0]
    )
    webhook_progress_s: float = Field(30.0, gt=0)
    webhook_senders: int = Field(4, ge=1, le=64)
    webhook_dispatch: bool = True
    public_url: str = ""

    @field_validator("webhook_secret", mode="before")
    @classmethod
    def _split_spaces(cls, value: object) -> object:
        if isinstance(value, str):
            return value.split()
        return value

    @field_validator("webhook_secret", mode="after")
    @classmethod
    def _whsec(cls, value: list[str]) -> list[str]:
        for n, secret in enumerate(value, 1):
            body = secret.removeprefix("whsec_")
            try:
                key = base64.b64decode(body + "==", validate=False) if secret.startswith("whsec_") else b""
            except (ValueError, binascii.Error):
                key = b""
            if not key:
                raise ValueError("FARM_WEBHOOK_SECRET: each secret is 'whsec_' followed by base64 of random bytes "
                                 f"(`farm webhooks --new-secret` makes one); secret {n} of {len(value)} is not")
        return value

    @field_validator("handback_grace", mode="after")
    @classmethod
    def _above_the_heartbeat(cls, value: float) -> float:
        if 0 < value < 5:
            raise ValueError(
                f"FARM_HANDBACK_GRACE must be 0 (off) or at least 5 s, well above the 1 s heartbeat; got {value}"
            )
        return value

    @field_validator("media_roots", "family_modules", mode="before")
    @classmethod
    def _split_like_path(cls, value: object) -> object:
        # os.pathsep-separated like PATH, because JSON lists in env vars are error-prone by hand.
        if isinstance(value, str):
            return [p.strip() for p in value.split(os.pathsep) if p.strip()]
        return value

    @field_validator("api_tokens", "cors_origins", "webhook_allow", "webhook_retry_schedule", "wake_pools",
                     "media_urls", mode="before")
    @classmethod
    def _split_commas(cls, value: object) -> object:
        # Comma-separated: tokens, origins and delays hold no commas, while origins hold colons.
        if isinstance(value, str):
            return [p.strip() for p in value.split(",") if p.strip()]
        return value

    @field_validator("storage_url", mode="after")
    @classmethod
    def _s3_url(cls, value: str) -> str:
        if value:
            S3Place.parse(value)  # a ValueError names what is wrong with it
        return value

    @field_validator("storage_dir", "uploads_dir", mode="after")
    @classmethod
    def _absolute(cls, value: Path | None) -> Path | None:
        # Fixed now: a relative path read again later, or by another process started elsewhere,
        # would name another folder (a job's files "missing" after it succeeded).
        return None if value is None else value.expanduser().absolute()

    @property
    def uploads_folder(self) -> Path:
        """The uploads folder: FARM_UPLOADS_DIR, or ``.uploads`` in the storage folder."""
        return self.uploads_dir or self.storage_dir / ".uploads"

    @property
    def input_roots(self) -> list[Path]:
        """Where a job's media may be: the media roots and the uploads folder (which the gateway
        fills; a job naming ``upload:<id>`` is sent with its path there)."""
        return [*self.media_roots, self.uploads_folder]

    @property
    def backend_url(self) -> str:
        return self.result_backend or self.broker_url

    @property
    def broker_is_rabbitmq(self) -> bool:
        return is_amqp(self.broker_url)


def is_amqp(url: str) -> bool:
    """Is ``url`` a RabbitMQ (AMQP 0.9.1) broker URL?"""
    return url.split("://", 1)[0] in ("amqp", "amqps", "pyamqp")


@functools.lru_cache(maxsize=1)
def get_settings() -> FarmSettings:
    """The process-wide settings, read once from the environment."""
    return FarmSettings()
