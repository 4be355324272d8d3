"""A multipart/form-data body read as it arrives, file bytes handed on without being spooled.

Starlette's own form parser keeps every file part in a temporary file before the route sees it,
so an upload's size limit would apply only after the whole body was on disk. Here the route gets
each piece of a file part as it is parsed and counts it against the limit itself.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

# Text fields (``model``, ``language`` ...) are small; together they may hold no more than this.
MAX_FIELD_BYTES = 64 * 1024


class BadMultipart(ValueError):
    """A body that is not the multipart/form-data it says it is, or text fields past the bound."""


@dataclass
class FilePart:
    """A file part of the body. Attributes: name (the form field), filename, content_type."""

    name: str
    filename: str
    content_type: str


@dataclass
class _Parsing:
    header_name: bytes = b""
    header_value: bytes = b""
    headers: dict[bytes, bytes] = field(default_factory=dict)
    file: FilePart | None = None
    text: bytearray = field(default_factory=bytearray)
    name: str = ""
    field_bytes: int = 0
    events: list[tuple[str, object]] = field(default_factory=list)


async def read_multipart(content_type: str, body: AsyncIterator[bytes]) -> AsyncIterator[tuple[str, object]]:
    """The body's parts as events, in order: ``("field", (name, text))`` for a text field, and for
    each file ``("file", FilePart)``, then ``("data", bytes)`` pieces, then ``("end", FilePart)``."""
    _, options = parse_options_header(content_type)
    boundary = options.get(b"boundary")
    if not boundary:
        raise BadMultipart("multipart/form-data without a boundary")
    state = _Parsing()

    def on_part_begin() -> None:
        state.headers, state.file, state.text, state.name = {}, None, bytearray(), ""

    def on_header_field(data: bytes, start: int, end: int) -> None:
        state.header_name += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        state.header_value += data[start:end]

    def on_header_end() -> None:
        state.headers[state.header_name.lower()] = state.header_value
        state.header_name = state.header_value = b""

    def on_headers_finished() -> None:
        _, disposition = parse_options_header(state.headers.get(b"content-disposition", b""))
        if b"name" not in disposition:
            raise BadMultipart('a part has no name (Content-Disposition: form-data; name="...")')
        state.name = disposition[b"name"].decode("utf-8", "replace")
        if b"filename" in disposition:
            content = state.headers.get(b"content-type", b"").decode("latin-1").strip()
            state.file = FilePart(state.name, disposition[b"filename"].decode("utf-8", "replace"), content)
            state.events.append(("file", state.file))

    def on_part_data(data: bytes, start: int, end: int) -> None:
        if state.file is not None:
            state.events.append(("data", bytes(data[start:end])))
            return
        state.field_bytes += end - start
        if state.field_bytes > MAX_FIELD_BYTES:
            raise BadMultipart(f"the form's text fields hold more than {MAX_FIELD_BYTES:,} bytes")
        state.text += data[start:end]

    def on_part_end() -> None:
        if state.file is not None:
            state.events.append(("end", state.file))
        else:
            state.events.append(("field", (state.name, state.text.decode("utf-8", "replace"))))

    parser = MultipartParser(boundary, {
        "on_part_begin": on_part_begin, "on_header_field": on_header_field, "on_header_value": on_header_value,
        "on_header_end": on_header_end, "on_headers_finished": on_headers_finished, "on_part_data": on_part_data,
        "on_part_end": on_part_end,
    })  # fmt: skip
    try:
        async for chunk in body:
            parser.write(chunk)
            events, state.events = state.events, []
            for event in events:
                yield event
        parser.finalize()
    except FormParserError as exc:
        raise BadMultipart(f"the multipart body cannot be read: {exc}") from None
    for event in state.events:
        yield event
