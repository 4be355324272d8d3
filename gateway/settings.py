"""What one gateway process serves by, read once from the farm's settings (``FARM_*``)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from mediafarm.config.settings import FarmSettings

# A job's JSON body is small (the largest request field, a TTS text, is bounded by its model): a
# bound here keeps a client from making the gateway hold an arbitrary body in memory.
MAX_JSON_BYTES = 1 << 20


@dataclass(frozen=True)
class GatewayConfig:
    """How the gateway authenticates, what it takes in, and where uploads go.

    Attributes:
        tokens: Bearer tokens accepted (``FARM_API_TOKENS``); empty: loopback clients only, no token.
        cors_origins: Origins allowed by CORS (``FARM_CORS_ORIGINS``); empty: no CORS headers.
        uploads_dir: Where uploads are kept (``FARM_UPLOADS_DIR``, default ``<storage>/.uploads``).
        storage_dir: Where the workers write artifacts (``FARM_STORAGE_DIR``), read for downloads.
        input_roots: Where a job's media may be: the media roots and the uploads folder.
        upload_max_bytes: The largest upload (``FARM_UPLOAD_MAX_MB``).
        upload_max_count: Uploads one token holds at once (``FARM_UPLOAD_MAX_COUNT``).
        poll_interval: Seconds between two looks at a followed job (events, a transcription's
            end) when its bell is silent. A follower is woken by the job's bell as the job
            changes (``tasks.producer.bells``); the look is for what a push cannot promise (a
            worker of an earlier release, a subscriber connection made again) and a pipeline's stages.
        heartbeat: Seconds between two comment lines on a quiet event stream, so that proxies and
            load balancers keep the connection.
        room_max_lines: Lines a dialogue room holds in flight, accepted and not yet wholly sent
            (``FARM_ROOM_MAX_LINES``, default 8); a line past it is answered ``busy``.
        room_queue: Where a room's line jobs go; None: the TTS family's queue.
        room_poll: Seconds between two looks at a room's head line when its bell is silent (one
            Redis round trip each, the whole job read only when it changed); a chunk is sent as
            its bell rings.
        speech_poll: Seconds between two looks at a speech stream's job (``POST /v1/audio/speech``)
            when its bell is silent (one Redis round trip each, the whole job read only when it
            changed, ``job_feed.JobWatch``); a chunk is sent as its bell rings.
        room_linger: Seconds a dropped room connection's unfinished lines wait for the client to
            connect again before they are cancelled (``FARM_ROOM_LINGER_S``, default 10).
        live_queue: Where a pushed live stream's job goes (``/v1/live/subtitles``); None: the
            subtitle-live family's queue.
        artifact_delivery: An artifact kept in the object store is ``stream``ed through the
            gateway or answered by a ``redirect`` to a presigned URL (``FARM_ARTIFACT_DELIVERY``).
        presign_seconds: How long such a URL is valid (``FARM_PRESIGN_SECONDS``).
        storage_url: ``s3://bucket/prefix`` where the farm keeps its files in an object store
            (``FARM_STORAGE_URL``): uploads' media go there too; None: the storage folder.
    """

    tokens: tuple[str, ...]
    cors_origins: tuple[str, ...]
    uploads_dir: Path
    storage_dir: Path
    input_roots: tuple[Path, ...]
    upload_max_bytes: int
    upload_max_count: int
    poll_interval: float = 0.5
    heartbeat: float = 15.0
    room_max_lines: int = 8
    room_queue: str | None = None
    room_poll: float = 0.25
    speech_poll: float = 0.25
    room_linger: float = 10.0
    live_queue: str | None = None
    artifact_delivery: str = "stream"
    presign_seconds: int = 900
    storage_url: str | None = None

    @classmethod
    def from_settings(cls, settings: FarmSettings) -> GatewayConfig:
        return cls(
            tokens=tuple(settings.api_tokens),
            cors_origins=tuple(settings.cors_origins),
            uploads_dir=settings.uploads_folder,
            storage_dir=settings.storage_dir,
            input_roots=tuple(settings.input_roots),
            upload_max_bytes=int(settings.upload_max_mb * 1_000_000),
            upload_max_count=settings.upload_max_count,
            room_max_lines=settings.room_max_lines,
            room_linger=settings.room_linger_s,
            artifact_delivery=settings.artifact_delivery,
            presign_seconds=settings.presign_seconds,
            storage_url=settings.storage_url or None,
        )


def is_loopback(host: str) -> bool:
    """Is ``host`` (an address, or ``localhost``) a loopback address?"""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_problem(host: str, config: GatewayConfig) -> str | None:
    """Why the gateway must not listen on ``host``, or None. Without tokens it serves anyone who can
    reach it with no check at all, so only loopback is allowed then."""
    if config.tokens or is_loopback(host):
        return None
    return (
        f"refusing to listen on {host}: without FARM_API_TOKENS the gateway serves anyone who reaches it. "
        "Set FARM_API_TOKENS (comma-separated bearer tokens) to serve other hosts, or listen on 127.0.0.1"
    )
