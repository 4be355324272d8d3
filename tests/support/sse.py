"""A Server-Sent Events reader for tests: the fields of each event as a browser's EventSource sees them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SseEvent:
    """One dispatched event. Attributes: event (its name), data, id (None when the event set none)."""

    event: str
    data: str
    id: str | None

    def json(self) -> Any:
        return json.loads(self.data)


@dataclass
class SseStream:
    """What was read from one response. Attributes: events, comments (heartbeats), last_id (what
    an EventSource would send as Last-Event-ID on reconnecting)."""

    events: list[SseEvent]
    comments: list[str]
    last_id: str | None = None


def read_events(lines: Iterator[str], stop: Callable[[SseEvent], bool] = lambda e: False) -> SseStream:
    """Read ``lines`` (``response.iter_lines()``) until the stream ends or ``stop`` says so after an event."""
    stream = SseStream([], [])
    fields: dict[str, str] = {}
    data: list[str] = []
    for line in lines:
        if line == "":
            if data or fields:
                event = SseEvent(fields.get("event", "message"), "\n".join(data), fields.get("id"))
                if event.id is not None:
                    stream.last_id = event.id
                stream.events.append(event)
                fields, data = {}, []
                if stop(event):
                    return stream
            continue
        if line.startswith(":"):
            stream.comments.append(line[1:].strip())
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        else:
            fields[name] = value
    return stream
