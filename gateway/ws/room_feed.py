"""Which of a room line's audio chunks to send, read from its job's snapshots (``JobHandle.snapshot``).

The TTS family announces each chunk as a partial output of the attempt that made it, with its
file (``chunks/chunk_NNNNN.wav``) in the job's folder. Partial outputs are per attempt: a new
attempt's record clears the old one's in the same Redis step (``tasks.wire.history``) and the attempt
clears the job's folder before it speaks (``ArtifactStore.clear``). So the rule is:

- chunks are sent as the running attempt makes them, each tagged with that attempt;
- if that attempt ends without success after some of its chunks were sent (killed, out of memory)
  and a newer one runs, a ``restart`` step comes first, saying how many chunks to discard, and the
  new attempt's chunks follow from its first one, at the line's own start: the two attempts'
  audio is never mixed, and the client knows where one stops and the other begins;
- the line ends when the job does: ``done`` with its envelope, or ``failed``.

Pure: no I/O here, so every order of snapshots can be tried in a unit test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mediafarm.tasks.producer.handles import Snapshot
from mediafarm.tasks.wire.plan import READY


@dataclass(frozen=True)
class Chunk:
    """Send chunk ``index`` of attempt ``attempt`` (``partial``: the TTS family's partial output:
    chunk, artifact, start, end, sentences). Attributes: rung: the attempt's rung."""

    attempt: int
    index: int
    rung: str
    partial: dict[str, Any]


@dataclass(frozen=True)
class Restart:
    """The attempt whose chunks were being sent ended without success; ``discarded`` of them were
    sent. The next chunks are attempt ``attempt``'s (on ``rung``), from the line's start."""

    attempt: int
    rung: str
    discarded: int
    reason: str


@dataclass(frozen=True)
class Done:
    """The line's job succeeded. Attributes: envelope (its result envelope)."""

    envelope: dict[str, Any]


@dataclass(frozen=True)
class Failed:
    """The line's job ended without success. Attributes: failure (``{"kind", "reason"}``), state."""

    failure: dict[str, Any]
    state: str


Step = Chunk | Restart | Done | Failed


class LineFeed:
    """One line's progress through its chunks: feed it snapshots, send the steps it gives, and
    :meth:`commit` each one sent (a chunk whose file could not be read is simply not committed:
    the next snapshot says what became of its attempt)."""

    def __init__(self) -> None:
        self.attempt: int | None = None  # the attempt whose chunks are being sent
        self.sent = 0  # how many of them

    def steps(self, snapshot: Snapshot) -> list[Step]:
        """What ``snapshot`` holds for the client past what was committed, in order."""
        if not snapshot.attempts:
            return self._ended(snapshot, [])
        owner = snapshot.owner
        out: list[Step] = []
        sent = self.sent
        if self.attempt is not None and owner != self.attempt:
            if self.sent:
                ended = snapshot.attempts[self.attempt] if self.attempt < len(snapshot.attempts) else {}
                reason = f"{ended.get('outcome') or 'ended'}: {ended.get('reason', '')}".rstrip(": ")
                out.append(Restart(owner, _rung(snapshot, owner), self.sent, reason))
            sent = 0
        rung = _rung(snapshot, owner)
        out += [Chunk(owner, i, rung, p) for i, p in enumerate(snapshot.partials) if i >= sent]
        return self._ended(snapshot, out)

    def commit(self, step: Step) -> None:
        if isinstance(step, Restart):
            self.attempt, self.sent = step.attempt, 0
        elif isinstance(step, Chunk):
            if step.attempt != self.attempt:  # the first chunk of a line (or of an attempt none was sent of)
                self.attempt, self.sent = step.attempt, 0
            self.sent = step.index + 1

    @staticmethod
    def _ended(snapshot: Snapshot, out: list[Step]) -> list[Step]:
        if snapshot.state == "SUCCESS" and snapshot.envelope is not None:
            out.append(Done(snapshot.envelope))
        elif snapshot.state in READY and snapshot.state != "SUCCESS":
            failure = snapshot.failure or {"kind": "failed", "reason": f"the job ended {snapshot.state}"}
            # A failed job's last attempt made no whole line: its chunks are not sent.
            out = [s for s in out if not isinstance(s, Chunk)]
            out.append(Failed(failure, snapshot.state))
        return out


def _rung(snapshot: Snapshot, attempt: int) -> str:
    return str(snapshot.attempts[attempt].get("rung", "")) if attempt < len(snapshot.attempts) else ""
