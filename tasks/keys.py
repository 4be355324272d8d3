"""Names of the Redis keys the farm writes beside Celery's own, in the result backend's database.

One prefix for all of them, so an operator can find (and a `SCAN mediafarm:*` can count) what the
farm keeps. Each key lives as long as the job's result (``result_expires``) unless said otherwise.
"""

from __future__ import annotations

PREFIX = "mediafarm"


def history(job_id: str) -> str:
    """Attempt history of one job: a list of JSON attempts, oldest first (``records.Attempt``)."""
    return f"{PREFIX}:attempts:{job_id}"


def kill(job_id: str) -> str:
    """Why the watchdog killed the child running a job (``records.KillRecord``), written before the SIGKILL."""
    return f"{PREFIX}:kill:{job_id}"


def progress(job_id: str) -> str:
    """The running attempt's latest progress (``records.Progress``); overwritten, throttled."""
    return f"{PREFIX}:progress:{job_id}"


def partials(job_id: str) -> str:
    """What a generator engine has yielded so far in the running attempt: a list of JSON items."""
    return f"{PREFIX}:partials:{job_id}"


def submitted(job_id: str) -> str:
    """A producer-chosen job id already used: who submitted what (``client.submit(job_id=...)``)."""
    return f"{PREFIX}:submitted:{job_id}"


def cancel(job_id: str) -> str:
    """Present when a producer asked for the job to stop; engines poll it (``EngineContext.cancelled``)."""
    return f"{PREFIX}:cancel:{job_id}"


def speakers() -> str:
    """The TTS speakers: a hash, name → JSON speaker (``families.tts.speakers``). Never expires."""
    return f"{PREFIX}:speakers"


def pipeline_plan(job_id: str) -> str:
    """The plan of the pipeline whose fan-in job is ``job_id`` (``plan.Plan`` as JSON)."""
    return f"{PREFIX}:pipeline:{job_id}"


def every_key() -> str:
    """A ``SCAN`` pattern matching every key named here (``farm gc`` checks a backend holds some)."""
    return f"{PREFIX}:*"
