"""Was a lost child killed by the kernel's OOM killer? Its OOM-kill counters, before and after.

A pool child SIGKILLed without a watchdog record was killed by the kernel's OOM killer or from
outside, and the worker sees the same ``WorkerLostError`` either way. The kernel counts its
OOM kills: per memory cgroup (v2 ``memory.events`` ``oom_kill``, hierarchical; v1
``memory.oom_control`` ``oom_kill``, the cgroup's own) and for the whole kernel (``/proc/vmstat``
``oom_kill``). The victim's cgroup counts the kill whether its own limit or the machine's memory
ran out. So each attempt records a count as it starts (:func:`snapshot`, in the child, which is
then in the cgroup the kernel would charge: the cgroup's count, or the kernel's where the child is
in no memory cgroup that keeps one), and the attempt that settles a lost one reads it again
(:func:`lost_child_cause`): a count that rose means the OOM killer, one that did not an outside kill.

The dead child's cgroup cannot be asked afterwards, but it is normally its worker's (the farm makes
no cgroup per child), so it is still there. The snapshot names it by path and by inode (unique in
one kernel, whatever a container's mount shows) and names the kernel by its boot id; a settling
process on another machine, after a reboot or in a cgroup that has since been replaced compares
nothing and says so. The count is read again only when the job runs again, and a cgroup holds all
of a worker's children: an OOM kill of a sibling in between is counted too, so the reason gives the
counts and the cgroup, not a claim about this pid alone (the kernel names no victim anywhere a
process may read). An attempt is judged lost because Celery's retry count moved on
(``tasks.runtime.downgrade``), which a retry after a Redis error that kept its outcome unwritten also
does: an unchanged count names an outside kill with that alternative. Everything here is
optional: a kernel or sandbox without these files gives no snapshot, and the cause stays "OOM
killer or an outside kill".
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from mediafarm.tasks.wire.records import Outcome

PROC = Path("/proc")
MIB = 1024 * 1024
# cgroup v1 shows "no limit" as PAGE_COUNTER_MAX pages in bytes (9223372036854771712 on 4 KiB pages).
_V1_UNLIMITED = 1 << 62
# cgroup version → the file holding its memory cgroup's OOM-kill count.
COUNTER_FILES = {1: "memory.oom_control", 2: "memory.events"}



# How each reason begins, for readers of a history (the chaos suite counts its own kills by them).
OOM_KILL = "killed by the kernel OOM killer"
OUTSIDE_KILL = "SIGKILLed from outside"
UNDECIDED = "child process SIGKILLed while running"


def _undecided(why: str = "") -> str:
    return f"{UNDECIDED} (kernel OOM killer or an outside kill; no watchdog record{why})"


# The cause of a lost child when its attempt recorded no counts (a record from before they were kept).
CHILD_LOST = _undecided()

_located: dict[int, tuple[int, str, int] | None] = {}  # pid → (version, dir, inode) of its memory cgroup
_boot: list[str] = []  # this kernel's boot id, read once


def parse_count(text: str, field: str = "oom_kill") -> int | None:
    """The value of ``field`` in a "name value" per line file (``memory.events``,
    ``memory.oom_control``, ``/proc/vmstat``); None if absent (v1 before Linux 4.13)."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == field:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def parse_limit(text: str) -> int | None:
    """Bytes of a cgroup memory limit file (v2 ``memory.max``, v1 ``memory.limit_in_bytes``); None: no limit."""
    value = text.strip()
    if not value or value == "max":
        return None
    try:
        limit = int(value)
    except ValueError:
        return None
    return None if limit >= _V1_UNLIMITED else limit


def _unescape(field: str) -> str:
    # mountinfo writes a space in a path as \040 (and tab, newline, backslash likewise).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def locate_memory_cgroup(proc_cgroup: str, mountinfo: str) -> tuple[int, str] | None:
    """(cgroup version, directory) of the memory cgroup that ``proc_cgroup`` (a
    ``/proc/<pid>/cgroup``) names, under the mounts of ``mountinfo``; None without a memory
    controller. A v1 memory hierarchy is preferred: the controller can be in one hierarchy only,
    and a hybrid system still mounts an empty cgroup2 beside it."""
    v1_path = v2_path = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if "memory" in controllers.split(","):
            v1_path = path
        elif hierarchy == "0" and not controllers:
            v2_path = path
    mounts = []
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, fs = left.split(), right.split()
        if not sep or len(fields) < 5 or len(fs) < 3:
            continue
        root, point, fstype, options = _unescape(fields[3]), _unescape(fields[4]), fs[0], fs[2].split(",")
        if fstype == "cgroup" and "memory" in options and v1_path is not None:
            mounts.append((1, root, point, v1_path))
        elif fstype == "cgroup2" and v2_path is not None:
            mounts.append((2, root, point, v2_path))
    mounts.sort(key=lambda m: (m[0], m[1] != "/"))  # v1 first; a mount of the whole hierarchy first
    for version, root, point, path in mounts:
        if root != "/" and (path == root or path.startswith(root + "/")):
            path = path[len(root):]
        directory = os.path.normpath(os.path.join(point, path.lstrip("/")))
        if os.path.isfile(os.path.join(directory, COUNTER_FILES[version])):
            return version, directory
    return None


def _read(path: Path | str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def _memory_cgroup(proc: Path) -> tuple[int, str, int] | None:
    """(version, directory, inode) of this process's memory cgroup, looked up once per process
    (a pool child stays in its worker's cgroup; a per-job lookup would read mountinfo every job)."""
    if proc == PROC and os.getpid() in _located:
        return _located[os.getpid()]
    cgroup, mountinfo = _read(proc / "self" / "cgroup"), _read(proc / "self" / "mountinfo")
    found = locate_memory_cgroup(cgroup, mountinfo) if cgroup and mountinfo else None
    try:
        located = (*found, os.stat(found[1]).st_ino) if found else None
    except OSError:
        located = None
    if proc == PROC:
        _located[os.getpid()] = located
    return located


def _boot_id(proc: Path) -> str | None:
    if proc == PROC and _boot:
        return _boot[0]
    text = _read(proc / "sys" / "kernel" / "random" / "boot_id")
    if proc == PROC and text is not None:
        _boot.append(text.strip())
    return text.strip() if text is not None else None


def snapshot(proc: Path = PROC) -> dict[str, Any] | None:
    """This process's OOM-kill count now, for its attempt record; None where none is readable.

    Keys: ``boot`` (the kernel's boot id); in a memory cgroup, ``cgroup`` (its directory),
    ``cgroup_version``, ``cgroup_ino`` and ``cgroup_kills``; outside one (or where its count is not
    kept), ``host_kills`` from ``/proc/vmstat`` instead. About 20 µs a job: the cgroup's file is
    small, and the kernel-wide one (170 lines) is read only where there is no cgroup count.
    """
    boot = _boot_id(proc)
    if boot is None:
        return None
    located = _memory_cgroup(proc)
    if located is not None:
        version, directory, ino = located
        text = _read(os.path.join(directory, COUNTER_FILES[version]))
        kills = parse_count(text) if text else None
        if kills is not None:
            return {"boot": boot, "cgroup": directory, "cgroup_version": version, "cgroup_ino": ino,
                    "cgroup_kills": kills}  # fmt: skip
    vmstat = _read(proc / "vmstat")
    kills = parse_count(vmstat) if vmstat else None
    return None if kills is None else {"boot": boot, "host_kills": kills}


def memory_limit(version: int, directory: str) -> int | None:
    """The memory limit in force for a cgroup: its own or a closer ancestor's, the smallest."""
    if version == 1:
        stat = _read(os.path.join(directory, "memory.stat"))
        hierarchical = parse_count(stat, "hierarchical_memory_limit") if stat else None
        if hierarchical is not None:
            return None if hierarchical >= _V1_UNLIMITED else hierarchical
        own = _read(os.path.join(directory, "memory.limit_in_bytes"))
        return parse_limit(own) if own else None
    limits = []
    path = Path(directory)
    while (path / "memory.max").is_file():  # the root cgroup has none, so this stops at it
        text = _read(path / "memory.max")
        if text and (limit := parse_limit(text)) is not None:
            limits.append(limit)
        path = path.parent
    return min(limits, default=None)


def _same_cgroup(counts: dict[str, Any]) -> bool:
    try:
        return os.stat(counts["cgroup"]).st_ino == counts["cgroup_ino"]
    except (OSError, KeyError, TypeError):
        return False


def _limit_words(version: int, directory: str) -> str:
    limit = memory_limit(version, directory)
    if limit is None:
        return "no cgroup memory limit: the machine's memory ran out"
    return f"memory limit {limit / MIB:.0f} MiB ({limit} bytes)"


def lost_child_cause(counts: dict[str, Any] | None, proc: Path = PROC) -> tuple[Outcome, str]:
    """Outcome and reason of an attempt whose child was SIGKILLed without a watchdog record,
    from the count it recorded at its start (:func:`snapshot`) and the same count now."""
    if not counts:
        return Outcome.KILLED, CHILD_LOST
    if _boot_id(proc) != counts.get("boot"):
        return Outcome.KILLED, _undecided("; its OOM-kill count is another kernel's, not comparable here")
    if "cgroup" in counts:
        directory, version, before = counts["cgroup"], counts.get("cgroup_version"), counts.get("cgroup_kills")
        text = _read(os.path.join(directory, COUNTER_FILES.get(version, ""))) if _same_cgroup(counts) else None
        now = parse_count(text) if text else None
        if now is None or before is None:
            return Outcome.KILLED, _undecided(f"; its memory cgroup {directory} is not readable here")
        if now > before:
            return Outcome.OOM, (
                f"{OOM_KILL}: its memory cgroup {directory} counted {now - before} OOM kill(s) "
                f"while it ran (oom_kill {before} → {now}); {_limit_words(version, directory)}"
            )
        return Outcome.KILLED, (
            f"{OUTSIDE_KILL}: not by the watchdog (no record) nor the kernel OOM killer (its memory "
            f"cgroup {directory} counted no OOM kill while it ran: oom_kill {now})"
        )
    vmstat = _read(proc / "vmstat")
    now = parse_count(vmstat) if vmstat else None
    before = counts.get("host_kills")
    if now is None or before is None:
        return Outcome.KILLED, _undecided("; no OOM-kill count readable to compare")
    if now > before:
        return Outcome.OOM, (
            f"{OOM_KILL}: the kernel counted {now - before} OOM kill(s) while it ran "
            f"(/proc/vmstat oom_kill {before} → {now}; the child was in no memory cgroup that counts its own)"
        )
    return Outcome.KILLED, (
        f"{OUTSIDE_KILL}: not by the watchdog (no record) nor the kernel OOM killer (the kernel counted no "
        f"OOM kill while it ran: /proc/vmstat oom_kill {now})"
    )
