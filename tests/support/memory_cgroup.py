"""A memory cgroup of a test's own, with a limit the kernel enforces, for the OOM killer tests.

Made where the machine allows one: under this process's own cgroup v1 memory hierarchy, or at the
root of a cgroup v2 hierarchy that has the memory controller (the root is the one cgroup that may
hold processes and enable controllers for its children at once). Anything else raises
:class:`CgroupUnavailable` with the reason, for the test to skip with.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

from mediafarm.tasks.runtime.oom_killer import COUNTER_FILES, parse_count

MIB = 1024 * 1024


class CgroupUnavailable(Exception):
    """No memory cgroup can be made here; the message says why."""


class MemoryCgroup:
    """One memory cgroup made by a test.

    Attributes:
        version: 1 or 2.
        path: Its directory.
    """

    def __init__(self, version: int, path: Path) -> None:
        self.version, self.path = version, path

    def add(self, pid: int) -> None:
        """Move a process in. Its memory charged so far stays where it was (the kernel moves no
        charges), so the limit bounds what it allocates from now on."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def set_limit(self, limit: int) -> None:
        (self.path / ("memory.limit_in_bytes" if self.version == 1 else "memory.max")).write_text(str(limit))

    def usage(self) -> int:
        return int((self.path / ("memory.usage_in_bytes" if self.version == 1 else "memory.current")).read_text())

    def oom_kills(self) -> int:
        count = parse_count((self.path / COUNTER_FILES[self.version]).read_text())
        assert count is not None, f"{self.path} keeps no oom_kill count (Linux before 4.13?)"
        return count

    def pids(self) -> list[int]:
        return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]

    def remove(self, timeout: float = 10.0) -> None:
        """SIGKILL whatever is still inside, then remove the cgroup."""
        deadline = time.monotonic() + timeout
        while True:
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            try:
                self.path.rmdir()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def _mounts() -> list[tuple[str, str, list[str]]]:
    """(fstype, mount point, super options) of every cgroup mount."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fs = right.split()
        if len(fs) >= 3 and fs[0] in ("cgroup", "cgroup2"):
            mounts.append((fs[0], left.split()[4], fs[2].split(",")))
    return mounts


def _own_v1_memory_dir(point: str) -> Path:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            own = Path(point) / path.lstrip("/")
            return own if own.is_dir() else Path(point)  # a namespaced view: the mount is our root
    return Path(point)


def _make(parent: Path, version: int) -> MemoryCgroup:
    path = parent / f"mediafarm-test-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
    except OSError as exc:
        raise CgroupUnavailable(f"cannot make a memory cgroup under {parent}: {exc}") from None
    return MemoryCgroup(version, path)


def create(limit: int) -> MemoryCgroup:
    """A new memory cgroup limited to ``limit`` bytes; the caller removes it (``remove``)."""
    mounts = _mounts()
    v1 = [point for fstype, point, options in mounts if fstype == "cgroup" and "memory" in options]
    v2 = [point for fstype, point, _ in mounts if fstype == "cgroup2"]
    if v1:
        cgroup = _make(_own_v1_memory_dir(v1[0]), 1)
    elif v2:
        root = Path(v2[0])
        controllers = (root / "cgroup.controllers").read_text().split()
        if "memory" not in controllers:
            raise CgroupUnavailable(f"cgroup v2 at {root} has no memory controller (controllers: {controllers})")
        try:
            (root / "cgroup.subtree_control").write_text("+memory")
        except OSError as exc:
            raise CgroupUnavailable(f"cannot enable the memory controller under {root}: {exc}") from None
        cgroup = _make(root, 2)
    else:
        raise CgroupUnavailable("no cgroup hierarchy is mounted here")
    try:
        cgroup.set_limit(limit)
    except OSError as exc:
        cgroup.remove()
        raise CgroupUnavailable(f"cannot set a memory limit on {cgroup.path}: {exc}") from None
    return cgroup
