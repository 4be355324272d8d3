"""Reading a Redis hash kept per pool (``<space>:<pool>``): one pool's, or every pool's by a SCAN.

The breakers (``keys.breakers``) and the failure tallies (``keys.rung_failures``) are both kept
this way, and ``farm families`` and the metrics read both for one pool or for all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def fields(client: Any, key_of: Callable[[str], str], pool: str | None = None) -> Iterator[tuple[str, str, bytes]]:
    """(pool, field, raw value) of every field of ``key_of(pool)``, or of every pool's hash when
    ``pool`` is None; pools in name order, each hash's fields in order."""
    prefix = key_of("")
    names = [key_of(pool)] if pool else sorted(client.scan_iter(match=key_of("*"), count=1000))
    for name in names:
        name = name.decode() if isinstance(name, bytes) else name
        for field, raw in sorted(client.hgetall(name).items()):
            yield name.removeprefix(prefix), field.decode() if isinstance(field, bytes) else field, raw
