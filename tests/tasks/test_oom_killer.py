"""The kernel's OOM killer told from an outside kill by its OOM-kill counts (``tasks.runtime.oom_killer``).

The parsers and the decision run on copies of the kernel's files (cgroup v1, cgroup v2, no
memory controller) in a temporary folder; the last tests put a real child in a real memory cgroup
with a small limit, where the machine allows one, and let the kernel kill it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mediafarm.tasks.runtime.downgrade import settle_open_attempts
from mediafarm.tasks.runtime.oom_killer import (
    CHILD_LOST,
    locate_memory_cgroup,
    lost_child_cause,
    memory_limit,
    parse_count,
    parse_limit,
    snapshot,
)
from mediafarm.tasks.wire.records import Attempt, Outcome
from tests.support.memory_cgroup import CgroupUnavailable, MemoryCgroup, create

MIB = 1024 * 1024
BOOT = "cf50bbcf-d6ae-4f47-ac35-2cd2d61fe718"
# As Linux 6.x writes them.
V2_EVENTS = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n"
V1_OOM_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n"
V1_UNLIMITED = "9223372036854771712\n"
V1_MOUNTINFO = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / {root}/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "35 31 0:32 / {root}/memory rw,relatime - cgroup cgroup rw,memory\n"
    "41 31 0:38 / {root}/unified rw,relatime - cgroup2 cgroup2 rw\n"
)
V1_CGROUP = "9:name=systemd:/\n4:memory:/farm/worker-1\n1:cpu:/\n0::/\n"


def test_counts_are_read_from_v2_events_v1_oom_control_and_vmstat() -> None:
    assert parse_count(V2_EVENTS) == 2  # not oom (3) or oom_group_kill, which share its prefix
    assert parse_count(V1_OOM_CONTROL) == 5
    assert parse_count("nr_free_pages 1\noom_kill 7\nnr_unevictable 0\n") == 7
    assert parse_count("oom_kill_disable 0\nunder_oom 0\n") is None  # v1 before Linux 4.13 keeps no count
    assert parse_count("oom_kill lots\n") is None
    assert parse_count(V1_OOM_CONTROL, "under_oom") == 0


def test_limits_read_with_no_limit_as_none() -> None:
    assert parse_limit("268435456\n") == 256 * MIB
    assert parse_limit("max\n") is None  # v2
    assert parse_limit(V1_UNLIMITED) is None  # v1's "no limit" is a huge number
    assert parse_limit("") is None and parse_limit("garbage") is None


def _files(directory: Path, **files: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name.replace("_", ".", 1)).write_text(text)
    return directory


def test_v1_memory_cgroup_is_found_under_its_mount(tmp_path: Path) -> None:
    own = _files(tmp_path / "memory" / "farm" / "worker-1", memory_oom_control=V1_OOM_CONTROL)
    assert locate_memory_cgroup(V1_CGROUP, V1_MOUNTINFO.format(root=tmp_path)) == (1, str(own))
    # A hybrid system mounts an empty cgroup2 too; the v1 memory hierarchy is the one that counts.
    _files(tmp_path / "unified", memory_events=V2_EVENTS)
    assert locate_memory_cgroup(V1_CGROUP, V1_MOUNTINFO.format(root=tmp_path))[0] == 1


def test_v2_memory_cgroup_is_found_and_a_namespaced_mount_root_is_taken_off(tmp_path: Path) -> None:
    own = _files(tmp_path / "sys fs" / "system.slice" / "farm.service", memory_events=V2_EVENTS)
    point = str(tmp_path / "sys fs").replace(" ", "\\040")  # mountinfo escapes a space in a path as \040
    mountinfo = f"30 23 0:26 / {point} rw - cgroup2 cgroup2 rw\n"
    assert locate_memory_cgroup("0::/system.slice/farm.service\n", mountinfo) == (2, str(own))
    # A container whose cgroup mount is rooted at its own cgroup, seen with the host's path.
    bound = _files(tmp_path / "ct", memory_events=V2_EVENTS)
    mountinfo = f"30 23 0:26 /docker/abc {bound} rw - cgroup2 cgroup2 rw\n"
    assert locate_memory_cgroup("0::/docker/abc\n", mountinfo) == (2, str(bound))


def test_no_memory_controller_is_no_cgroup(tmp_path: Path) -> None:
    # cgroup v2 without the memory controller (as on these machines' unified mount): no memory.events.
    _files(tmp_path / "unified" / "job", cgroup_procs="")
    mountinfo = f"41 31 0:38 / {tmp_path}/unified rw - cgroup2 cgroup2 rw\n"
    assert locate_memory_cgroup("0::/job\n", mountinfo) is None
    assert locate_memory_cgroup("", "") is None


def _proc(tmp_path: Path, cgroup: str, mountinfo: str, vmstat: str = "oom_kill 0\n", boot: str = BOOT) -> Path:
    proc = tmp_path / "proc"
    _files(proc / "self", cgroup=cgroup, mountinfo=mountinfo)
    (_files(proc / "sys" / "kernel" / "random") / "boot_id").write_text(boot + "\n")
    (proc / "vmstat").write_text(vmstat)
    return proc


def _v1_world(tmp_path: Path) -> tuple[Path, Path]:
    parent = _files(tmp_path / "memory" / "farm", memory_limit_in_bytes=V1_UNLIMITED)
    own = _files(parent / "worker-1", memory_oom_control=V1_OOM_CONTROL, memory_limit_in_bytes=str(256 * MIB),
                 memory_stat=f"cache 0\nhierarchical_memory_limit {256 * MIB}\n")  # fmt: skip
    return _proc(tmp_path, V1_CGROUP, V1_MOUNTINFO.format(root=tmp_path)), own


def test_v1_count_that_rose_names_the_oom_killer_and_the_limit(tmp_path: Path) -> None:
    proc, own = _v1_world(tmp_path)
    counts = snapshot(proc)
    assert counts == {"boot": BOOT, "cgroup": str(own), "cgroup_version": 1, "cgroup_ino": os.stat(own).st_ino,
                      "cgroup_kills": 5}  # fmt: skip
    (own / "memory.oom_control").write_text(V1_OOM_CONTROL.replace("oom_kill 5", "oom_kill 6"))
    outcome, reason = lost_child_cause(counts, proc)
    assert outcome is Outcome.OOM
    assert "kernel OOM killer" in reason and str(own) in reason and "oom_kill 5 → 6" in reason
    assert "memory limit 256 MiB" in reason


def test_v1_count_that_stayed_is_an_outside_kill(tmp_path: Path) -> None:
    proc, own = _v1_world(tmp_path)
    outcome, reason = lost_child_cause(snapshot(proc), proc)
    assert outcome is Outcome.KILLED and reason.startswith("SIGKILLed from outside") and "oom_kill 5" in reason


def test_v2_limit_is_the_smallest_up_the_tree(tmp_path: Path) -> None:
    top = _files(tmp_path / "unified" / "farm.slice", memory_max=str(300 * MIB), memory_events=V2_EVENTS)
    own = _files(top / "worker", memory_max="max\n", memory_events=V2_EVENTS)
    mountinfo = f"41 31 0:38 / {tmp_path}/unified rw - cgroup2 cgroup2 rw\n"
    proc = _proc(tmp_path, "0::/farm.slice/worker\n", mountinfo)
    counts = snapshot(proc)
    assert counts["cgroup_version"] == 2 and counts["cgroup_kills"] == 2
    assert memory_limit(2, str(own)) == 300 * MIB
    (own / "memory.events").write_text(V2_EVENTS.replace("oom_kill 2", "oom_kill 3"))
    outcome, reason = lost_child_cause(counts, proc)
    assert outcome is Outcome.OOM and "memory limit 300 MiB" in reason
    (top / "memory.max").write_text("max\n")
    assert "no cgroup memory limit: the machine's memory ran out" in lost_child_cause(counts, proc)[1]


def test_without_a_memory_cgroup_the_kernels_count_decides(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "0::/\n", "", vmstat="pgfault 10\noom_kill 4\n")
    counts = snapshot(proc)
    assert counts == {"boot": BOOT, "host_kills": 4}
    assert lost_child_cause(counts, proc)[0] is Outcome.KILLED
    (proc / "vmstat").write_text("pgfault 10\noom_kill 5\n")
    outcome, reason = lost_child_cause(counts, proc)
    assert outcome is Outcome.OOM and "/proc/vmstat oom_kill 4 → 5" in reason


def test_counts_that_cannot_be_compared_leave_the_cause_open(tmp_path: Path) -> None:
    proc, own = _v1_world(tmp_path)
    counts = snapshot(proc)
    # Another kernel (another machine, or after a reboot): its counts mean nothing here.
    outcome, reason = lost_child_cause({**counts, "boot": "another-boot"}, proc)
    assert outcome is Outcome.KILLED and "another kernel's" in reason
    # The cgroup was removed and another made under the same path (another inode), or it is gone.
    (own / "memory.oom_control").write_text(V1_OOM_CONTROL.replace("oom_kill 5", "oom_kill 9"))
    outcome, reason = lost_child_cause({**counts, "cgroup_ino": counts["cgroup_ino"] + 1}, proc)
    assert outcome is Outcome.KILLED and "is not readable here" in reason
    outcome, reason = lost_child_cause({**counts, "cgroup": str(tmp_path / "gone")}, proc)
    assert outcome is Outcome.KILLED and "is not readable here" in reason
    # An attempt recorded by a farm that kept no counts, and a machine with none of these files.
    assert lost_child_cause(None, proc) == (Outcome.KILLED, CHILD_LOST)
    assert snapshot(tmp_path / "no-proc") is None


def test_a_retried_lost_child_is_settled_from_its_counts(tmp_path: Path) -> None:
    # Through the downgrade policy, with this process's real /proc: an attempt whose counts are
    # another kernel's cannot be judged; one recorded just now with no OOM kill since was killed
    # from outside (a concurrent OOM kill on this machine would make this flaky only if it hit
    # this process's own memory cgroup, which holds no test children).
    stale = Attempt(0, "v0", retries=0, pid=1, worker="w", oom_counts={"boot": "gone", "host_kills": 0})
    now = Attempt(0, "v0", retries=0, pid=2, worker="w", oom_counts=snapshot())
    settle_open_attempts([stale, now], None, retries=1, transient_budget=2)
    assert stale.outcome is Outcome.KILLED and "another kernel's" in stale.reason
    if now.oom_counts is None:
        # Skipped only where the kernel itself keeps no count (asked directly: None is also what a
        # broken snapshot returns); where /proc/vmstat counts OOM kills, snapshot must have read it.
        vmstat = Path("/proc/vmstat").read_text() if Path("/proc/vmstat").exists() else ""
        boot = Path("/proc/sys/kernel/random/boot_id").exists()
        assert not (boot and re.search(r"^oom_kill \d+$", vmstat, re.M)), "the kernel counts OOM kills; snapshot missed it"
        pytest.skip("this machine exposes no OOM-kill count (/proc/vmstat, memory cgroup)")
    assert now.outcome is Outcome.KILLED and now.reason.startswith("SIGKILLed from outside"), now.reason


# A child that joins the cgroup, prints its snapshot, then holds memory until the kernel kills it
# (or, "wait", until the test does). It stops at four times the limit: where the kernel enforced no
# limit it exits 0 instead of eating the machine.
CHILD = """
import json, os, sys, time
with open(sys.argv[1], "w") as fh:
    fh.write(str(os.getpid()))
from mediafarm.tasks.runtime.oom_killer import snapshot
print(json.dumps(snapshot()), flush=True)
if sys.argv[2] == "wait":
    time.sleep(60)
held = [bytearray(b"\\x01") * (4 << 20) for _ in range(int(sys.argv[3]) // (1 << 20))]
print("survived", flush=True)
"""
LIMIT = 64 * MIB


@pytest.fixture
def small_cgroup() -> MemoryCgroup:
    try:
        cgroup = create(LIMIT)
    except CgroupUnavailable as exc:
        pytest.skip(f"no memory cgroup with a limit can be made on this machine: {exc}")
    yield cgroup
    cgroup.remove()


def _child(cgroup: MemoryCgroup, mode: str) -> tuple[subprocess.Popen[str], dict]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(cgroup.path / "cgroup.procs"), mode, str(LIMIT)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    counts = json.loads(child.stdout.readline())
    assert counts and counts["cgroup"] == str(cgroup.path), counts
    return child, counts


def test_a_real_kernel_oom_kill_in_a_memory_cgroup_is_named(small_cgroup: MemoryCgroup) -> None:
    child, counts = _child(small_cgroup, "hog")
    out, _ = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL, f"the kernel did not kill the child (rc {child.returncode}): {out}"
    assert small_cgroup.oom_kills() == counts["cgroup_kills"] + 1
    outcome, reason = lost_child_cause(counts)
    assert outcome is Outcome.OOM, reason
    assert reason.startswith("killed by the kernel OOM killer") and str(small_cgroup.path) in reason
    assert "memory limit 64 MiB" in reason


def test_a_real_outside_kill_in_a_memory_cgroup_is_not_the_oom_killer(small_cgroup: MemoryCgroup) -> None:
    child, counts = _child(small_cgroup, "wait")
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=30)
    assert child.returncode == -signal.SIGKILL
    outcome, reason = lost_child_cause(counts)
    assert outcome is Outcome.KILLED and reason.startswith("SIGKILLed from outside"), reason
