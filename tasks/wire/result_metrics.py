"""Numbers of a family's result that the workers count: :class:`ResultMetric`, declared in ``FamilySpec.metrics``.

A family lists them in its spec; the worker's main process (``workers/metrics.py``) makes one
Prometheus metric per name from the registry and, for every successful job of a family that
declares some, reads the job's output back and adds each number to its metric, labelled with the
job's family and rung (the rung that answered; ``variant``, the same name, for one release) and the
declaration's own labels. No file of the
farm names a family's metric. Families may share a metric (every video family's frames in
``mediafarm_frames_total``) when they declare it alike; the registry refuses two families that
declare one name differently.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

PREFIX = "mediafarm_"
# The labels every metric has: the job's family and rung (its name; ``variant``, the same name, is
# kept for one release: docs/operating.md, "Upgrading").
JOB_LABELS = ("family", "rung", "variant")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class ResultMetric:
    """One number of a finished job's output, counted into a Prometheus metric.

    Attributes:
        name: The metric's name after ``mediafarm_`` (``frames_total``); a counter's ends in ``_total``.
        path: Dotted path of the number in the output (``frames.examined``). An output without
            it, or with None there, adds nothing.
        help: The metric's one-line description (its HELP).
        kind: ``counter`` (the number is added) or ``histogram`` (observed once a job).
        labels: Fixed labels of this number, as pairs (``(("fate", "examined"),)``), beside family
            and rung.
        buckets: A histogram's bucket bounds, ascending.
    """

    name: str
    path: str
    help: str
    kind: Literal["counter", "histogram"] = "counter"
    labels: tuple[tuple[str, str], ...] = ()
    buckets: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem:
            raise ValueError(f"result metric {self.name!r}: {problem}")

    def _problem(self) -> str | None:
        if not _NAME.match(self.name):
            return f"the name must match {_NAME.pattern} (the farm adds {PREFIX!r})"
        if not _PATH.match(self.path):
            return f"path {self.path!r} must be dotted field names (frames.examined)"
        if not self.help.strip():
            return "needs a help line"
        if self.kind not in ("counter", "histogram"):
            return f"kind must be 'counter' or 'histogram', got {self.kind!r}"
        if self.kind == "counter" and (not self.name.endswith("_total") or self.buckets):
            return "a counter's name ends in '_total' and it has no buckets"
        if self.kind == "histogram" and (not self.buckets or list(self.buckets) != sorted(set(self.buckets))):
            return "a histogram needs buckets, ascending"
        names = [label for label, _ in self.labels]
        if len(set(names)) != len(names) or set(names) & set(JOB_LABELS) or not all(map(_NAME.match, names)):
            return f"labels {names} must be distinct lowercase names other than {list(JOB_LABELS)}"
        return None

    @classmethod
    def counter(cls, name: str, path: str, help: str, **labels: str) -> ResultMetric:
        """A counter: ``ResultMetric.counter("frames_total", "frames.examined", "...", fate="examined")``."""
        return cls(name, path, help, "counter", tuple(sorted(labels.items())))

    @classmethod
    def histogram(cls, name: str, path: str, help: str, buckets: tuple[float, ...], **labels: str) -> ResultMetric:
        """A histogram, one observation per finished job."""
        return cls(name, path, help, "histogram", tuple(sorted(labels.items())), tuple(buckets))

    @property
    def full_name(self) -> str:
        return PREFIX + self.name

    @property
    def label_names(self) -> tuple[str, ...]:
        return (*JOB_LABELS, *(label for label, _ in self.labels))

    @property
    def shape(self) -> tuple[Any, ...]:
        """What two declarations of one metric must agree on (one Prometheus metric serves both)."""
        return (self.kind, self.help, self.label_names, self.buckets)

    def root_field(self) -> str:
        """The result model's field the path starts at."""
        return self.path.split(".")[0]

    def value(self, output: Any) -> float | None:
        """The number at :attr:`path` in a stored output (JSON), or None if there is none."""
        for key in self.path.split("."):
            if not isinstance(output, Mapping):
                return None
            output = output.get(key)
        if isinstance(output, bool) or not isinstance(output, int | float) or not math.isfinite(output):
            return None
        return float(output)
