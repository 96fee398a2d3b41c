"""/proc readers (corepin.sysfs.procfs): fake trees for the parsing, the real /proc for the rest."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from corepin.core.cpuset import CPUSet
from corepin.core.errors import SysfsError
from corepin.sysfs.procfs import (
    ProcessGone,
    cgroup_of,
    children,
    cpus_allowed_list,
    descendants,
    iter_tree_threads,
    list_pids,
    list_threads,
    mems_allowed_list,
    parse_cgroup,
    parse_mountinfo,
    parse_stat,
    process_alive,
    process_start_time,
    read_cgroup,
    read_mountinfo,
    read_stat,
)


def stat_line(pid: int, comm: str, ppid: int, start: int, state: str = "S") -> str:
    # fields 3..52 after "(comm)": state ppid pgrp session tty tpgid flags minflt cminflt majflt
    # cmajflt utime stime cutime cstime priority nice num_threads itrealvalue starttime ...
    rest = [state, str(ppid)] + ["0"] * 17 + [str(start)] + ["0"] * 30
    return f"{pid} ({comm}) " + " ".join(rest) + "\n"


def fake_proc(tmp_path: Path, procs: dict[int, tuple[str, int, int]]) -> Path:
    root = tmp_path / "proc"
    for pid, (comm, ppid, start) in procs.items():
        d = root / str(pid)
        (d / "task" / str(pid)).mkdir(parents=True)
        (d / "stat").write_text(stat_line(pid, comm, ppid, start))
        (d / "status").write_text(
            f"Name:\t{comm}\nPid:\t{pid}\nPPid:\t{ppid}\n"
            "Cpus_allowed:\t3\nCpus_allowed_list:\t0-1\nMems_allowed_list:\t0\n"
        )
        (d / "cgroup").write_text(
            "12:cpuset:/kubepods/pod1/abc\n11:cpu,cpuacct:/kubepods/pod1/abc\n"
            "1:name=systemd:/init.scope\n0::/user.slice\n"
        )
    (root / "self").mkdir(parents=True, exist_ok=True)
    return root


@pytest.mark.parametrize(
    "comm",
    [
        pytest.param("bash", id="a plain comm"),
        pytest.param("my prog", id="a comm with a space"),
        pytest.param("a) S 1 2 (b", id="a comm that imitates the following fields"),
        pytest.param("((x))", id="a comm with nested parentheses"),
        pytest.param("", id="an empty comm"),
    ],
)
def test_stat_is_parsed_from_the_last_closing_parenthesis(comm: str) -> None:
    stat = parse_stat(stat_line(4242, comm, 17, 987654))
    assert (stat.pid, stat.comm, stat.ppid, stat.start_time, stat.state) == (
        4242,
        comm,
        17,
        987654,
        "S",
    )


def test_truncated_stat_is_an_error_naming_the_file() -> None:
    with pytest.raises(SysfsError, match="/proc/9/stat"):
        parse_stat("9 (x) S 1 2 3", "/proc/9/stat")
    with pytest.raises(SysfsError, match="comm"):
        parse_stat("garbage", "/proc/9/stat")


def test_fake_tree_children_and_descendants(tmp_path: Path) -> None:
    root = fake_proc(
        tmp_path,
        {
            1: ("init", 0, 1),
            10: ("shell (login)", 1, 100),
            11: ("worker", 10, 110),
            12: ("worker", 10, 120),
            13: ("grandchild", 11, 130),
            20: ("other", 1, 200),
        },
    )
    assert list_pids(root) == [1, 10, 11, 12, 13, 20]
    assert children(10, root) == [11, 12]
    assert descendants(10, root) == [11, 12, 13]
    assert descendants(13, root) == []
    assert process_start_time(10, root) == 100
    assert read_stat(10, root).comm == "shell (login)"
    assert process_alive(11, 110, root)
    assert not process_alive(11, 111, root), "a different start time means the pid was reused"
    assert not process_alive(99, None, root)
    assert cpus_allowed_list(10, root) == CPUSet.parse("0-1")
    assert mems_allowed_list(10, root) == CPUSet.of(0)
    assert list_threads(10, root) == [10]
    assert sorted(iter_tree_threads(10, root)) == [(10, 10), (11, 11), (12, 12), (13, 13)]


def test_missing_process_raises_process_gone_which_is_a_lookup_error(tmp_path: Path) -> None:
    root = fake_proc(tmp_path, {1: ("init", 0, 1)})
    with pytest.raises(ProcessGone) as info:
        read_stat(77, root)
    assert isinstance(info.value, LookupError)
    assert "77" in str(info.value)
    with pytest.raises(ProcessGone):
        list_threads(77, root)


def test_cgroup_file_of_a_hybrid_host_gives_v1_and_v2_entries(tmp_path: Path) -> None:
    root = fake_proc(tmp_path, {5: ("x", 1, 5)})
    entries = read_cgroup(5, root)
    assert cgroup_of(entries, "cpuset") == "/kubepods/pod1/abc"
    assert cgroup_of(entries, "cpuacct") == "/kubepods/pod1/abc"
    assert cgroup_of(entries, "name=systemd") == "/init.scope"
    assert cgroup_of(entries, None) == "/user.slice"
    assert cgroup_of(entries, "memory") is None


def test_pure_v2_cgroup_file() -> None:
    entries = parse_cgroup("0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-ab.scope\n")
    assert len(entries) == 1 and entries[0].unified
    assert cgroup_of(entries, None) == "/kubepods.slice/kubepods-pod1.slice/cri-containerd-ab.scope"


def test_malformed_cgroup_line_is_an_error() -> None:
    with pytest.raises(SysfsError, match="not 'id:controllers:path'"):
        parse_cgroup("garbage\n", "/proc/1/cgroup")


MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:4 master:1 - cgroup2 cgroup2 rw
50 23 0:40 /docker/abc /mnt/with\\040space rw - ext4 /dev/sda1 rw
"""


def test_mountinfo_parsing_handles_optional_fields_and_escapes() -> None:
    mounts = parse_mountinfo(MOUNTINFO)
    by_point = {m.mount_point: m for m in mounts}
    assert by_point["/sys/fs/cgroup/cpu,cpuacct"].cgroup_controllers == ("cpu", "cpuacct")
    assert by_point["/sys/fs/cgroup/cpuset"].cgroup_controllers == ("cpuset",)
    assert by_point["/sys/fs/cgroup/systemd"].cgroup_controllers == ("name=systemd",)
    assert by_point["/sys/fs/cgroup/unified"].fstype == "cgroup2"
    assert by_point["/mnt/with space"].root == "/docker/abc"


def test_malformed_mountinfo_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "mountinfo"
    path.write_text("1 2 3\n")
    with pytest.raises(SysfsError, match="mountinfo"):
        read_mountinfo(path)


# ------------------------------------------------------------------ the real /proc


def test_real_process_identity_tree_and_threads() -> None:
    code = (
        "import threading, time, subprocess, sys\n"
        "ev = threading.Event()\n"
        "ts = [threading.Thread(target=ev.wait) for _ in range(3)]\n"
        "[t.start() for t in ts]\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        child_pid = int(proc.stdout.readline())
        start = process_start_time(proc.pid)
        assert process_alive(proc.pid, start)
        assert children(proc.pid) == [child_pid]
        assert child_pid in descendants(os.getpid())
        deadline = time.monotonic() + 5
        while len(list_threads(proc.pid)) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(list_threads(proc.pid)) >= 4, "main thread plus three waiting threads"
        assert cpus_allowed_list(proc.pid) == CPUSet(os.sched_getaffinity(proc.pid))
        assert read_cgroup(proc.pid), "every process is in at least one hierarchy"
    finally:
        for pid in descendants(proc.pid):
            os.kill(pid, 9)
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    assert not process_alive(proc.pid, start)


def test_thread_status_can_be_read_per_thread() -> None:
    event = threading.Event()
    thread = threading.Thread(target=event.wait)
    thread.start()
    try:
        tid = thread.native_id
        assert tid is not None
        assert tid in list_threads(os.getpid())
        assert cpus_allowed_list(os.getpid(), tid=tid) == CPUSet(os.sched_getaffinity(tid))
    finally:
        event.set()
        thread.join()


def test_mountinfo_filtered_by_type_is_the_full_parse_filtered() -> None:
    """Cgroup detection reads only the cgroup mounts: the same records the full parse gives
    for them, whatever else is mounted (a malformed line of another type is not its concern)."""
    overlay = (
        "901 30 0:99 / /var/lib/docker/overlay2/x/merged rw,relatime - overlay overlay "
        "rw,lowerdir=/a:/b"
    )
    text = MOUNTINFO + "\n" + overlay + "\n"
    full = parse_mountinfo(text)
    for types in (("cgroup",), ("cgroup2",), ("cgroup", "cgroup2"), ("overlay",), ("nfs",)):
        assert parse_mountinfo(text, fstypes=types) == [m for m in full if m.fstype in types]
    broken = text + "77 1 0:1 / /odd rw - tmpfs\n"  # too few fields after the separator
    with pytest.raises(SysfsError):
        parse_mountinfo(broken)
    cgroups = parse_mountinfo(broken, fstypes=("cgroup", "cgroup2"))
    assert cgroups == [m for m in full if m.fstype in ("cgroup", "cgroup2")]
