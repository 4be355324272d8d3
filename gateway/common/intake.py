"""A job's JSON body as its family's request fields: the checks the gateway makes before it submits.

Over HTTP a request is its JSON form, as the family's request model's schema describes it. Three
things differ from a Python producer's ``submit``:

- A string is refused where the schema takes only a list or an object. Some such fields also
  take a file path in Python (the dialogue's ``script``); read by the gateway, that would be a
  remote client reading the gateway's own files.
- A media field may name an upload, ``upload:<id>``, which becomes the upload's path on the farm
  (or its object's ``s3://`` URL where the farm keeps its files in an object store),
  or an http(s) URL, which the worker fetches from a host ``FARM_MEDIA_URLS`` lists.
- Media paths are checked against the input roots here, as the worker would, so a path outside
  them is a 422 now rather than a rejected job later.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from mediafarm.tasks.wire.errors import InvalidRequest, PermanentFailure
from mediafarm.tasks.wire.family import FamilySpec
from mediafarm.tasks.wire.media_paths import resolve_media
from mediafarm.tasks.wire.media_urls import is_media_url
from mediafarm.tasks.wire.upload_store import UnknownUpload, Upload, UploadStore

UPLOAD_PREFIX = "upload:"


@dataclass(frozen=True)
class Intake:
    """A body ready to submit. Attributes: fields (the request, uploads replaced by their
    paths), uploads (the uploads it names, to be kept as long as the job)."""

    fields: dict[str, Any]
    uploads: tuple[Upload, ...]


def _json_types(schema: dict[str, Any], defs: dict[str, Any]) -> set[str]:
    """The JSON types ``schema`` admits (``any`` for a schema that admits every value)."""
    if "$ref" in schema:
        return _json_types(defs.get(schema["$ref"].rsplit("/", 1)[-1], {}), defs)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return set().union(*(_json_types(s, defs) for s in schema[key]))
    if "allOf" in schema:
        return set().union(*(_json_types(s, defs) for s in schema["allOf"]))
    for key in ("enum", "const"):
        if key in schema:
            values = schema[key] if key == "enum" else [schema[key]]
            return {"string" if isinstance(v, str) else "value" for v in values}
    kind = schema.get("type")
    if kind is None:
        return {"any"}
    return set(kind) if isinstance(kind, list) else {kind}


@functools.cache
def structured_fields(model: type[BaseModel]) -> frozenset[str]:
    """The request fields whose JSON schema takes only lists and objects (and null): a string
    there is one of Python's shortcuts (a file to read, ``"vtt,srt"``), never taken over HTTP."""
    schema = model.model_json_schema(mode="validation")
    defs = schema.get("$defs", {})
    return frozenset(
        name for name, field in schema.get("properties", {}).items()
        if (types := _json_types(field, defs)) and types <= {"array", "object", "null"}
    )  # fmt: skip


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "a list", bool: "true or false", int: "a number", float: "a number"}.get(
        type(value), "a string"
    )


def prepare(spec: FamilySpec, body: Any, owner: str, store: UploadStore, roots: tuple[Path, ...]) -> Intake:
    """Check ``body`` as a request of ``spec``; InvalidRequest naming the field if it does not fit.

    Blocking (media paths are looked up on disk): call it in a worker thread.
    """
    name = spec.name
    if not isinstance(body, dict):
        raise InvalidRequest(f"{name} request: the body must be a JSON object of the request's fields, "
                             f"got {_json_type(body)}")  # fmt: skip
    for field in sorted(structured_fields(spec.request) & body.keys()):
        if isinstance(body[field], str):
            raise InvalidRequest.of_fields(name, [(field, "over HTTP this field is given as its JSON value, a list "
                                                   "or an object (see the schema at /docs), not as a string")])
    spec.parse_request(body)  # the request's own checks, in its own words
    fields = dict(body)
    uploads = []
    for field in spec.media_fields:
        value = fields.get(field)
        if not isinstance(value, str):
            continue
        if is_media_url(value):
            if store.objects is not None and store.objects.holds(value):
                # By its URL, an upload would escape its owner's check (the workers read that folder).
                raise InvalidRequest.of_fields(name, [(field, "name an upload as upload:<id>, not by its URL")])
            continue  # its shape was checked above; the worker checks its host and fetches it
        named_upload = value.startswith(UPLOAD_PREFIX)
        if named_upload:
            try:
                upload = store.get(owner, value[len(UPLOAD_PREFIX) :])
            except UnknownUpload as exc:
                raise InvalidRequest.of_fields(name, [(field, str(exc))]) from None
            uploads.append(upload)
            fields[field] = value = upload.media
            if upload.url is not None:
                continue  # in the object store: the worker reads it there
        try:
            real = resolve_media(value, list(roots))
        except PermanentFailure as exc:
            raise InvalidRequest.of_fields(name, [(field, str(exc))]) from None
        if not named_upload and real.is_relative_to(store.root.resolve()):
            # By its path, an upload would escape its owner's check: only upload:<id> names one.
            raise InvalidRequest.of_fields(name, [(field, "name an upload as upload:<id>, not by its path")])
    return Intake(fields, tuple(uploads))
