"""Admission limits: how much work the farm takes before ``submit`` refuses with ``Overloaded``.

On by default. Operators change them in the ``[admission]`` table of ``FARM_CONFIG_FILE``, with
``[admission.families.<family>]`` and ``[admission.pools.<pool>]`` tables for one family or pool::

    [admission]
    enabled = true                 # false: no limit at all, every submit is sent
    max_queued = 1000              # jobs waiting in one family's queues (all priorities)
    max_queued_per_tenant = 200    # jobs one gateway token has submitted that have not started
    retry_after = 5                # seconds a refused producer is told to wait
    depth_cache = 0.25             # seconds one producer process reuses a queue-depth or memory reading (1 s at most)

    [admission.families.tts]
    max_queued = 50                # an interactive family: refuse early rather than queue for minutes
    max_queued_per_tenant = 8

    [admission.pools.gpu0]
    min_available_mb = 2048        # host or cgroup memory available, whichever is smaller
    min_available_fraction = 0.05  # ... as a share of the total (the cgroup's limit in a cgroup)
    min_gpu_free_mb = 1024         # free memory of any of the pool's GPUs (NVML); 0: not looked at
    pressure_retry_after = 15

A limit of 0 turns that one check off.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from mediafarm.config.file import ConfigFileError, section, table_over


@dataclass(frozen=True)
class FamilyAdmission:
    """Queue limits of one family.

    Attributes:
        max_queued: Jobs that may wait in the family's queues (every priority, its GPU affinity
            queues too); the next submit is refused. 0: no limit.
        max_queued_per_tenant: Jobs one tenant (a gateway token) may have submitted and not yet
            started, in this family; 0: no limit. Producers calling ``submit`` without a tenant
            are bound by ``max_queued`` only.
        retry_after: Seconds a producer refused for depth is told to wait.
    """

    max_queued: int = 1000
    max_queued_per_tenant: int = 200
    retry_after: float = 5.0

    def __post_init__(self) -> None:
        if self.max_queued < 0 or self.max_queued_per_tenant < 0:
            raise ConfigFileError("max_queued and max_queued_per_tenant must be >= 0 (0: no limit)")
        if self.retry_after <= 0:
            raise ConfigFileError("retry_after must be positive")


@dataclass(frozen=True)
class PoolAdmission:
    """Memory-pressure thresholds of one pool, compared with what its workers report.

    Attributes:
        min_available_mb: The pool is under pressure when the memory available to it (the host's,
            or its cgroup's limit minus what the cgroup uses, whichever is smaller) falls below this.
        min_available_fraction: ... or below this share of its total memory (the cgroup's limit
            where there is one).
        min_gpu_free_mb: ... or when any of its GPUs has less free memory than this (NVML); 0 off:
            the CUDA caching allocator keeps memory it no longer uses, so free GPU memory is low on
            a busy healthy GPU, and a job that finds too little moves down its ladder anyway.
        pressure_retry_after: Seconds a producer refused for pressure is told to wait.
    """

    min_available_mb: float = 256.0
    min_available_fraction: float = 0.05
    min_gpu_free_mb: float = 0.0
    pressure_retry_after: float = 15.0

    def __post_init__(self) -> None:
        if self.min_available_mb < 0 or self.min_gpu_free_mb < 0 or not 0 <= self.min_available_fraction < 1:
            raise ConfigFileError("thresholds: MB values >= 0, min_available_fraction in [0, 1)")
        if self.pressure_retry_after <= 0:
            raise ConfigFileError("pressure_retry_after must be positive")


@dataclass(frozen=True)
class Admission:
    """The farm's admission settings: defaults, and the families' and pools' own."""

    enabled: bool = True
    depth_cache: float = 0.25
    family_default: FamilyAdmission = field(default_factory=FamilyAdmission)
    pool_default: PoolAdmission = field(default_factory=PoolAdmission)
    families: Mapping[str, FamilyAdmission] = field(default_factory=lambda: MappingProxyType({}))
    pools: Mapping[str, PoolAdmission] = field(default_factory=lambda: MappingProxyType({}))

    def family(self, name: str) -> FamilyAdmission:
        return self.families.get(name, self.family_default)

    def pool(self, name: str) -> PoolAdmission:
        return self.pools.get(name, self.pool_default)


_FAMILY_KEYS = {f.name for f in fields(FamilyAdmission)}
_POOL_KEYS = {f.name for f in fields(PoolAdmission)}


def parse(table: dict[str, Any]) -> Admission:
    """The ``[admission]`` table as settings (ConfigFileError naming a wrong key or value)."""
    table = dict(table)
    families = table.pop("families", {})
    pools = table.pop("pools", {})
    enabled = table.pop("enabled", True)
    depth_cache = table.pop("depth_cache", 0.25)
    if not isinstance(enabled, bool):
        raise ConfigFileError("[admission] enabled must be true or false")
    if not isinstance(depth_cache, int | float) or not 0 <= depth_cache <= 10:
        raise ConfigFileError("[admission] depth_cache must be a number of seconds in [0, 10]")
    family_keys = {k: v for k, v in table.items() if k in _FAMILY_KEYS}
    pool_keys = {k: v for k, v in table.items() if k in _POOL_KEYS}
    unknown = set(table) - _FAMILY_KEYS - _POOL_KEYS
    if unknown:
        raise ConfigFileError(f"[admission] unknown keys: {sorted(unknown)}")
    family_default = table_over(FamilyAdmission(), family_keys, "[admission]")
    pool_default = table_over(PoolAdmission(), pool_keys, "[admission]")
    if not isinstance(families, dict) or not isinstance(pools, dict):
        raise ConfigFileError("[admission.families] and [admission.pools] must be tables of tables")
    return Admission(
        enabled=enabled,
        depth_cache=float(depth_cache),
        family_default=family_default,
        pool_default=pool_default,
        families=MappingProxyType(
            {n: table_over(family_default, t, f"[admission.families.{n}]") for n, t in families.items()}
        ),
        pools=MappingProxyType(
            {n: table_over(pool_default, t, f"[admission.pools.{n}]") for n, t in pools.items()}
        ),
    )


def admission_problems() -> list[str]:
    """A mistake in ``[admission]``, for the worker's and the gateway's start checks: read lazily
    by ``submit``, it would otherwise refuse every job of the farm, one 422 at a time."""
    try:
        get_admission()
    except ConfigFileError as exc:
        return [str(exc)]
    return []


@functools.lru_cache(maxsize=1)
def get_admission() -> Admission:
    """The farm's admission settings, read once per process from ``FARM_CONFIG_FILE``."""
    return parse(section("admission"))
