"""Node QoS in host mode on this host's real cgroups: `corepin run --qos-class`, the BE group,
`corepin reconcile --qos-config` squeezing it, `corepin report` showing the classes.

Every test has its own state directory (so its own cgroup parent, `corepin/<state dir key>`);
the runs are real processes, and whatever a test leaves in the cpuset, cpu and cpuacct
hierarchies is removed by the fixture, failed or not. resctrl is only ever a fake tree.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from corepin.agent.settings import state_dir_key
from corepin.core.cpuset import CPUSet
from support.helpers import allowed_cpus, corepin_argv, run_corepin, wait_for
from support.resctrl_tree import make_resctrl_tree

CGROUP = Path("/sys/fs/cgroup")
HIERARCHIES = ("cpuset", "cpu", "cpuacct")


def cpuset_writable() -> bool:
    return os.geteuid() == 0 and (CGROUP / "cpuset" / "cpuset.cpus").exists()


needs_cpuset = pytest.mark.skipif(
    not cpuset_writable(), reason="needs root and a cgroup v1 cpuset hierarchy at /sys/fs/cgroup"
)


class Host:
    """One state directory, the runs a test started in it and the cgroups they made."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.parent = f"corepin/{state_dir_key(str(state))}"
        self.procs: list[subprocess.Popen[str]] = []

    def args(self, command: str, *rest: str, cgroups: str = "on") -> list[str]:
        return [command, "--state-dir", str(self.state), "--cgroups", cgroups, *rest]

    def corepin(
        self, command: str, *rest: str, cgroups: str = "on"
    ) -> subprocess.CompletedProcess[str]:
        return run_corepin(*self.args(command, *rest, cgroups=cgroups))

    def start(self, *run_args: str) -> dict[str, object]:
        """`corepin run RUN_ARGS -- sleep 120` in the background; its report row once recorded."""
        before = {a["id"] for a in self.allocations()}
        proc = subprocess.Popen(
            corepin_argv(*self.args("run", *run_args, "--", "sleep", "120")), text=True
        )
        self.procs.append(proc)
        found: list[dict[str, object]] = []

        def recorded() -> bool:
            found[:] = [a for a in self.allocations() if a["id"] not in before and a["alive"]]
            return bool(found) and os.path.exists(f"/proc/{found[0]['pid']}")

        wait_for(recorded, what="the run to be recorded")
        return found[0]

    def report(self, *extra: str) -> dict[str, object]:
        done = self.corepin("report", "-o", "json", *extra)
        assert done.returncode == 0, done.stderr
        data: dict[str, object] = json.loads(done.stdout)
        return data

    def allocations(self) -> list[dict[str, object]]:
        rows = self.report()["allocations"]
        assert isinstance(rows, list)
        return rows

    def group(self, hierarchy: str, *below: str) -> Path:
        return CGROUP.joinpath(hierarchy, self.parent, *below)

    def cpus(self, *below: str) -> CPUSet:
        return CPUSet.parse((self.group("cpuset", *below) / "cpuset.cpus").read_text().strip())

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.corepin("reconcile", "--once")
        for hierarchy in HIERARCHIES:  # whatever is left: deepest first
            top = self.group(hierarchy)
            if not top.exists():
                continue
            for folder in sorted((p for p in top.rglob("*") if p.is_dir()), reverse=True):
                with contextlib.suppress(OSError):
                    folder.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    made = Host(tmp_path / "state")
    try:
        yield made
    finally:
        made.cleanup()
    for hierarchy in HIERARCHIES:
        assert not made.group(hierarchy).exists(), f"{hierarchy}: {made.parent} left behind"


def cgroups_of(pid: int) -> dict[str, str]:
    """controller -> the process's group (v1 lines of /proc/PID/cgroup)."""
    out: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            if controller:
                out[controller] = path
    return out


def write_policy(folder: Path, text: str, name: str = "qos.yaml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


# ---------------------------------------------------------------------- refusals, any user
def test_qos_class_be_for_an_exclusive_run_exits_2_naming_the_option(tmp_path: Path) -> None:
    host = Host(tmp_path / "state")
    done = host.corepin("run", "--qos-class", "BE", "--exclusive", "1", "--", "true", cgroups="off")
    assert done.returncode == 2, done.stderr
    assert "--qos-class BE" in done.stderr and "shared runs only" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (host.state / "state.json").exists(), "nothing was recorded"


def test_an_unknown_qos_class_exits_2_naming_the_option_and_the_value(tmp_path: Path) -> None:
    host = Host(tmp_path / "state")
    done = host.corepin("run", "--qos-class", "gold", "--", "true", cgroups="off")
    assert done.returncode == 2
    assert "--qos-class: 'gold' is not a QoS class" in done.stderr


def test_a_bad_qos_config_for_run_exits_2_and_runs_nothing(tmp_path: Path) -> None:
    host = Host(tmp_path / "state")
    bad = write_policy(tmp_path, "cpuBurst: {policy: sometimes}\n")
    marker = tmp_path / "ran"
    done = host.corepin("run", "--qos-config", str(bad), "--", "touch", str(marker), cgroups="off")
    assert done.returncode == 2
    assert str(bad) in done.stderr and "cpuBurst.policy" in done.stderr
    assert not marker.exists() and not (host.state / "qos-policy.json").exists()


def test_a_run_joins_its_classes_resctrl_group_before_its_command_runs(tmp_path: Path) -> None:
    root = tmp_path / "resctrl"
    kernel = make_resctrl_tree(root)
    kernel.mkdir(root / "corepin-be")
    host = Host(tmp_path / "state")
    done = host.corepin(
        "run",
        "--shared",
        "--qos-class",
        "BE",
        "--resctrl-root",
        str(root),
        "--",
        "sh",
        "-c",
        "echo $$",
        cgroups="off",
    )
    assert done.returncode == 0, done.stderr
    pid = done.stdout.strip()  # sh execs in the process corepin forked: the same pid
    assert (root / "corepin-be" / "tasks").read_text().split() == [pid]
    plain = host.corepin("run", "--resctrl-root", str(root), "--", "true", cgroups="off")
    assert plain.returncode == 0, plain.stderr
    assert (root / "corepin-be" / "tasks").read_text().split() == [pid], "LS has no group"


def test_a_missing_resctrl_root_is_a_note_not_an_error(tmp_path: Path) -> None:
    host = Host(tmp_path / "state")
    done = host.corepin(
        "run", "--resctrl-root", str(tmp_path / "none"), "--", "true", cgroups="off"
    )
    assert done.returncode == 0, done.stderr
    assert "no resctrl at" in done.stderr


# ---------------------------------------------------------------------- real cgroups
@needs_cpuset
@pytest.mark.realhost
def test_a_be_run_lands_in_the_be_group_and_the_report_shows_every_class(host: Host) -> None:
    be = host.start("--shared", "--qos-class", "BE")
    ls = host.start("--shared")
    pid = int(str(be["pid"]))
    want = f"/{host.parent}/besteffort/{be['id']}"
    ls_want = f"/{host.parent}/{ls['id']}"
    # a run's child joins its groups while corepin commits the run: wait for the joins
    wait_for(
        lambda: (
            all(cgroups_of(pid)[name] == want for name in HIERARCHIES)
            and cgroups_of(int(str(ls["pid"])))["cpuacct"] == ls_want
        ),
        what="the runs to join their groups",
    )
    groups = cgroups_of(pid)
    assert {name: groups[name] for name in HIERARCHIES} == dict.fromkeys(HIERARCHIES, want)
    assert cgroups_of(int(str(ls["pid"])))["cpuacct"] == ls_want
    assert CPUSet.parse(allowed_cpus(pid)) <= host.cpus("besteffort")
    classes = {a["id"]: a["qos_class"] for a in host.allocations()}
    assert classes == {be["id"]: "BE", ls["id"]: "LS"}
    table = host.corepin("report")
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    assert header.split()[:5] == ["ID", "NAME", "PID", "KIND", "QOS"]
    shown = {row.split()[0]: row.split()[4] for row in rows[:2]}
    assert shown == {be["id"]: "BE", ls["id"]: "LS"}
    yaml_text = host.corepin("report", "-o", "yaml").stdout
    assert "qos_class: BE" in yaml_text and "qos_class: LS" in yaml_text
    assert "qos_classes" not in host.report("--resctrl-root", str(host.state / "none"))


@needs_cpuset
@pytest.mark.realhost
def test_reconcile_squeezes_the_be_group_while_an_ls_run_keeps_its_cpus(
    host: Host, tmp_path: Path
) -> None:
    be = host.start("--shared", "--qos-class", "BE")
    ls = host.start("--shared")
    ls_pid = int(str(ls["pid"]))
    be_before = host.cpus("besteffort")
    ls_before = (host.cpus(str(ls["id"])), allowed_cpus(ls_pid))
    assert be_before == CPUSet.parse(str(ls["cpus"])), "BE starts with the whole shared pool"
    policy = write_policy(tmp_path, "beSuppress: {policy: cpuset, minCPUs: 1}\n")
    done = host.corepin("reconcile", "--once", "--qos-config", str(policy))
    assert done.returncode == 0, done.stderr
    be_after = host.cpus("besteffort")
    assert be_after < be_before and len(be_after) >= 1, (be_before, be_after, done.stdout)
    assert "besteffort" in done.stdout, "the change is printed like reconcile's others"
    assert host.cpus("besteffort", str(be["id"])) == be_after
    assert CPUSet.parse(allowed_cpus(int(str(be["pid"])))) == be_after
    assert (host.cpus(str(ls["id"])), allowed_cpus(ls_pid)) == ls_before
    kept = json.loads((host.state / "qos-policy.json").read_text())
    assert kept["beSuppress"] == {"policy": "cpuset", "sloPercent": 65, "minCPUs": 1}
    # a later BE run gets the squeezed set, and a later pass without --qos-config keeps it
    late = host.start("--shared", "--qos-class", "BE")
    assert CPUSet.parse(allowed_cpus(int(str(late["pid"])))) == be_after
    again = host.corepin("reconcile", "--once")
    assert again.returncode == 0, again.stderr
    assert host.cpus("besteffort") <= be_before and len(host.cpus("besteffort")) >= 1


@needs_cpuset
@pytest.mark.realhost
def test_a_bad_qos_config_exits_2_naming_the_field_and_keeps_the_old_policy(
    host: Host, tmp_path: Path
) -> None:
    good = write_policy(tmp_path, "beSuppress: {policy: cfsQuota, sloPercent: 50}\n", "good.yaml")
    first = host.corepin("reconcile", "--once", "--qos-config", str(good))
    assert first.returncode == 0, first.stderr
    kept = (host.state / "qos-policy.json").read_bytes()
    assert json.loads(kept)["beSuppress"]["policy"] == "cfsQuota"
    bad = write_policy(tmp_path, "beSuppress: {sloPercent: 150}\n", "bad.yaml")
    done = host.corepin("reconcile", "--once", "--qos-config", str(bad))
    assert done.returncode == 2
    assert str(bad) in done.stderr and "beSuppress.sloPercent: 150 is outside 1..100" in done.stderr
    assert "Traceback" not in done.stderr
    assert (host.state / "qos-policy.json").read_bytes() == kept
    assert not [p for p in host.state.iterdir() if p.name.startswith(".qos-policy")]


@needs_cpuset
@pytest.mark.realhost
def test_a_steady_qos_loop_writes_nothing_once_the_be_group_is_squeezed(host: Host) -> None:
    from corepin.agent.host.agent import HostAgent
    from corepin.agent.host.qos import HostQos
    from corepin.agent.host.reconcile import reconcile_once
    from corepin.agent.host.settings import HostSettings
    from corepin.allocation.qos import parse_policy

    be = host.start("--shared", "--qos-class", "BE")
    host.start("--shared")
    agent = HostAgent(HostSettings(state_dir=str(host.state), cgroups="on"))
    # sloPercent 1: a budget under one CPU on any machine, so the set is minCPUs whatever runs
    policy = parse_policy({"beSuppress": {"policy": "cpuset", "sloPercent": 1, "minCPUs": 1}})
    loop = HostQos(agent, policy=policy)
    reconcile_once(agent, loop)  # keeps the policy, measures
    squeezed = reconcile_once(agent, loop)
    assert any("besteffort" in note.target for note in squeezed), squeezed
    assert len(host.cpus("besteffort")) == 1
    assert allowed_cpus(int(str(be["pid"]))) == str(host.cpus("besteffort"))
    checkpoint = host.state / "state.json"
    before = (checkpoint.stat().st_mtime_ns, agent.pinner.writes)
    assert reconcile_once(agent, loop) == []
    assert (checkpoint.stat().st_mtime_ns, agent.pinner.writes) == before


@needs_cpuset
@pytest.mark.realhost
def test_a_running_loop_applies_an_edited_qos_config_and_refuses_a_bad_edit(
    host: Host, tmp_path: Path
) -> None:
    from corepin.agent.host.agent import HostAgent
    from corepin.agent.host.qos import HostQos
    from corepin.agent.host.reconcile import reconcile_once
    from corepin.agent.host.settings import HostSettings
    from corepin.agent.qos_file import read_policy_file

    host.start("--shared", "--qos-class", "BE")
    path = write_policy(tmp_path, "beSuppress: {policy: off}\n")
    agent = HostAgent(HostSettings(state_dir=str(host.state), cgroups="on"))
    loop = HostQos(agent, policy=read_policy_file(str(path)), config=str(path))
    reconcile_once(agent, loop)
    pool = host.cpus("besteffort")
    assert loop.policy().be_suppress.policy == "off"
    # edited while the loop runs: the next pass reads it, keeps it and squeezes BE
    path.write_text("beSuppress: {policy: cpuset, sloPercent: 1, minCPUs: 1}\n")
    notes = reconcile_once(agent, loop)
    assert any("read the changed QoS policy" in n.detail for n in notes), notes
    assert loop.policy().be_suppress.slo_percent == 1
    kept = json.loads((host.state / "qos-policy.json").read_text())
    assert kept["beSuppress"]["policy"] == "cpuset"
    assert len(host.cpus("besteffort")) == 1 < len(pool) or len(pool) == 1
    # a bad edit: a note naming the field, the policy in force stays
    path.write_text("beSuppress: {policy: cpuset, sloPercent: 0}\n")
    notes = reconcile_once(agent, loop)
    refused = [n for n in notes if n.action == "refused"]
    assert refused and "beSuppress.sloPercent: 0 is outside 1..100" in refused[0].detail
    assert loop.policy().be_suppress.slo_percent == 1
    assert json.loads((host.state / "qos-policy.json").read_text()) == kept
