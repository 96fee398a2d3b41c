"""Host mode on cgroup v2 in the layouts the kernel allows besides the one corepin makes itself,
in the numa4-smt2 guest (16 CPUs, 4 nodes, cgroup v2 only):

- processes in an inner group (a group corepin must hand cpuset down from): v2 lets a group
  with processes enable cpuset, but turns it into a threaded subtree root (`domain threaded`)
  and every domain child of it invalid; with a domain controller (memory) enabled above, the
  no-internal-process rule applies in full. corepin must refuse in one clear line, exit 4,
  and leave the group's type alone;
- groups someone else made on corepin's path that do not hand cpuset down (empty
  subtree_control): the run still gets a cpuset of its own CPUs; and an inheriting (empty)
  `cpuset.cpus` above a run's group that someone sets to CPUs leaving out the run's: the kernel
  falls back to that parent's CPUs for the run's group (its own `cpuset.cpus` unchanged), and
  reconcile widens the parent so the run is back on its CPUs;
- threaded subtrees: corepin's state-directory group, or corepin's own top group, made
  `threaded` by someone: corepin's groups below are made threaded too (a domain group there
  is invalid), the run is pinned, `report` still sees its processes (a threaded group's
  cgroup.procs cannot be read), reconcile repairs drift there;
- partitions next to processes in corepin's inner group, and a partition refused because a
  threaded group holds its CPUs, falling back to a plain cpuset.

Each scenario runs in one guest command; the checks read what the kernel shows."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vm import SHAPES, Guest
from vm import skip_reason as vm_skip_reason

pytestmark = [
    pytest.mark.vm,
    pytest.mark.skipif(vm_skip_reason() is not None, reason=vm_skip_reason() or ""),
]

SHAPE = SHAPES["numa4-smt2"]
NODE_CPUS = {n: set(SHAPE.cpus_of_node(n)) for n in range(SHAPE.nodes)}
ALL = set(range(SHAPE.cpus))

#: shell set-up shared by the scenarios: a scratch state directory whose cgroup parent is
#: corepin/$K, and `clean`, which moves every task out of corepin's groups and removes them
PRELUDE = r"""
C=/sys/fs/cgroup
PROBE="python tests/vm/probe.py"
export COREPIN_STATE_DIR=/tmp/layouts-state COREPIN_CGROUPS=on
K=$(python -c "from corepin.agent.settings import state_dir_key as k; import sys
print(k(sys.argv[1]))" $COREPIN_STATE_DIR)
P=corepin/$K
fresh() { rm -rf $COREPIN_STATE_DIR /tmp/h; mkdir -m 700 $COREPIN_STATE_DIR; mkdir /tmp/h; }
clean() {
    for g in $(find $C -mindepth 1 -depth -type d -path "$C/corepin*"); do
        for t in $(cat $g/cgroup.threads 2> /dev/null); do echo $t > $C/cgroup.procs 2> /dev/null
        done
        rmdir $g 2> /dev/null
    done
}
# one JSON line: {"case": NAME, KEY: VALUE...} from NAME KEY=VALUE... (values are strings)
say() { python -c 'import json, sys; a = sys.argv[1:]
print(json.dumps({"case": a[0], **dict(x.split("=", 1) for x in a[1:])}))' "$@"; }
err() { head -c 1000 /tmp/h/err | tr '\n' '|'; }
tracebacks() { grep -c Traceback /tmp/h/err; }
hold() {  # NAME ARGS...: corepin run ARGS -- probe self --hold /tmp/h/NAME, in the background
    n=$1; shift
    corepin run "$@" -- $PROBE self --hold /tmp/h/$n > /tmp/h/$n.out 2>&1 &
    echo $! > /tmp/h/$n.runner
    while [ ! -e /tmp/h/$n ]; do
        kill -0 $(cat /tmp/h/$n.runner) 2> /dev/null || { cat /tmp/h/$n.out >&2; return 1; }
        sleep 0.1
    done
}
pid_of() { sed 's/.*"pid": \([0-9]*\).*/\1/' /tmp/h/$1; }
release() { echo > /tmp/h/$1.done; wait $(cat /tmp/h/$1.runner); }
allowed() { sed -n 's/^Cpus_allowed_list:\t//p' /proc/$1/status; }
group_of() { sed -n 's/^0:://p' /proc/$1/cgroup; }
field() { sed "s/.*\"$1\": \"\([^\"]*\)\".*/\1/" $2; }  # KEY FILE: a string of a probe line
changes() {
    python -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))["changes"]))' $1
}
statuses() {
    python -c 'import json, sys
print(" ".join(sorted(a["status"] for a in json.load(open(sys.argv[1]))["allocations"])))' $1
}
clean
"""


def cpus(text: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def cases(stdout: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for line in stdout.splitlines():
        if line.startswith('{"case"'):
            row = json.loads(line)
            out[row.pop("case")] = row
    return out


def run(guest: Guest, body: str) -> dict[str, dict[str, Any]]:
    result = guest.run(PRELUDE + body + "\nclean\n", timeout=500)
    assert result.returncode == 0, result.output[-4000:]
    return cases(result.stdout)


INNER = r"""
# 1. a process in corepin's top group: enabling cpuset there would make it `domain threaded`
fresh; mkdir $C/corepin; sleep 600 & S=$!; echo $S > $C/corepin/cgroup.procs
corepin run --exclusive 2 -- true 2> /tmp/h/err; rc=$?
say top rc=$rc type="$(cat $C/corepin/cgroup.type)" err="$(err)" tb=$(tracebacks) \
    lines=$(wc -l < /tmp/h/err) \
    procs="$(cat $C/corepin/cgroup.procs)" sleeper=$S \
    subtree="$(cat $C/corepin/cgroup.subtree_control)"
corepin report -o json > /dev/null 2> /tmp/h/err; say top-report rc=$? tb=$(tracebacks)
kill $S; wait $S 2> /dev/null; clean

# 2. memory enabled above and a process in the state directory's group: the full rule
fresh; echo +memory > $C/cgroup.subtree_control
mkdir -p $C/$P; echo +memory > $C/corepin/cgroup.subtree_control
sleep 600 & S=$!; echo $S > $C/$P/cgroup.procs
corepin run --exclusive 2 -- true 2> /tmp/h/err; rc=$?
say memory rc=$rc type="$(cat $C/$P/cgroup.type)" err="$(err)" tb=$(tracebacks) \
    procs="$(cat $C/$P/cgroup.procs)" sleeper=$S children=$(find $C/$P -mindepth 1 -type d | wc -l)
kill $S; wait $S 2> /dev/null; clean; echo -memory > $C/cgroup.subtree_control

# 3. an isolated partition while a process sits in corepin's top group
fresh; mkdir $C/corepin; sleep 600 & S=$!; echo $S > $C/corepin/cgroup.procs
hold part --exclusive 4 --option numa=2 --partition isolated
R=$(pid_of part); G=$(group_of $R)
say partition run="$(allowed $R)" state="$(cat $C$G/cpuset.cpus.partition)" \
    sleeper="$(allowed $S)" type="$(cat $C/corepin/cgroup.type)"
release part; kill $S; wait $S 2> /dev/null; clean
"""


def test_processes_in_an_inner_group_are_refused_clearly_and_partitions_still_work(
    vm_numa4_smt2: Guest,
) -> None:
    got = run(vm_numa4_smt2, INNER)
    top = got["top"]
    # refused in one line naming the group and why, exit 4, no traceback, nothing changed
    assert top["rc"] == "4" and top["tb"] == "0", top
    assert "holds processes" in top["err"] and f"({top['sleeper']})" in top["err"], top
    assert top["lines"] == "1", top  # and no warning about a release that cannot happen
    assert top["type"] == "domain", "corepin turned a group with processes into a thread root"
    assert top["subtree"] == "" and top["procs"] == top["sleeper"]
    assert got["top-report"] == {"rc": "0", "tb": "0"}
    memory = got["memory"]
    assert memory["rc"] == "4" and memory["tb"] == "0", memory
    assert "/corepin/sd-" in memory["err"] and "holds processes" in memory["err"], memory
    assert memory["type"] == "domain" and memory["procs"] == memory["sleeper"]
    assert memory["children"] == "0"
    # a partition group sits below the root, beside corepin's top group: its processes are no
    # obstacle, and they lose the partition's CPUs while it lasts
    part = got["partition"]
    assert part["state"] == "isolated"
    assert cpus(part["run"]) == NODE_CPUS[2]
    assert cpus(part["sleeper"]) == ALL - NODE_CPUS[2]
    assert part["type"] == "domain"


INHERIT = r"""
# 4. corepin's groups exist already (someone made them) but nobody handed cpuset down
fresh; clean; echo -cpuset > $C/cgroup.subtree_control; mkdir -p $C/$P
say before root="$(cat $C/cgroup.subtree_control)" top="$(cat $C/corepin/cgroup.subtree_control)"
corepin run --exclusive 2 --option numa=1 -- $PROBE self 2> /tmp/h/err > /tmp/h/out; rc=$?
say made rc=$rc err="$(err)" tb=$(tracebacks) cpus="$(field cpus /tmp/h/out)" \
    group="$(field cgroup /tmp/h/out)"

# 5. someone gives the state directory's group (empty: it inherited every CPU) CPUs of its
#    own that leave out the run's: the run's group keeps its cpuset.cpus, but the kernel hands
#    it (and the run) the parent's CPUs instead - the shared pool's
fresh
hold ex --exclusive 4 --option numa=3
R=$(pid_of ex); G=$(group_of $R)
before="$(cat $C/$P/cpuset.cpus)"
echo 0-3 > $C/$P/cpuset.cpus
say narrowed before="$before" cpus="$(cat $C$G/cpuset.cpus)" \
    effective="$(cat $C$G/cpuset.cpus.effective)" run="$(allowed $R)"
corepin reconcile --once -o json > /tmp/h/rec 2> /tmp/h/err; rc=$?
say repaired rc=$rc tb=$(tracebacks) effective="$(cat $C$G/cpuset.cpus.effective)" \
    run="$(allowed $R)" parent="$(cat $C/$P/cpuset.cpus)" changes="$(changes /tmp/h/rec)"
corepin reconcile --once -o json > /tmp/h/rec2; say steady changes="$(cat /tmp/h/rec2)"
release ex; clean
"""


def test_groups_that_do_not_hand_cpuset_down_are_repaired(
    vm_numa4_smt2: Guest,
) -> None:
    got = run(vm_numa4_smt2, INHERIT)
    assert "cpuset" not in got["before"]["root"].split()
    made = got["made"]
    assert made["rc"] == "0" and made["tb"] == "0", made
    assert cpus(made["cpus"]) <= NODE_CPUS[1] and len(cpus(made["cpus"])) == 2
    assert made["group"].startswith("/corepin/sd-") and "/run-" in made["group"]
    narrowed = got["narrowed"]
    assert narrowed["before"] == "" and cpus(narrowed["cpus"]) == NODE_CPUS[3]
    assert cpus(narrowed["effective"]) == {0, 1, 2, 3} == cpus(narrowed["run"])  # off its CPUs
    repaired = got["repaired"]
    assert repaired["rc"] == "0" and repaired["tb"] == "0", repaired
    assert cpus(repaired["effective"]) == NODE_CPUS[3] == cpus(repaired["run"]), repaired
    assert cpus(repaired["parent"]) == {0, 1, 2, 3} | NODE_CPUS[3]
    assert "widen-ancestor" in repaired["changes"] and "failed" not in repaired["changes"]
    assert json.loads(got["steady"]["changes"])["changes"] == []


THREADED = r"""
# 6. the state directory's group made threaded by someone
fresh; mkdir -p $C/$P; echo threaded > $C/$P/cgroup.type
hold th --exclusive 2 --option numa=2
R=$(pid_of th); G=$(group_of $R)
# a process the run left behind keeps the allocation lingering once the run is gone
corepin run --exclusive 2 --option numa=0 -- sh -c 'sleep 600 > /dev/null 2>&1 & echo $!' \
    > /tmp/h/left 2> /tmp/h/left.err
L=$(cat /tmp/h/left); LG=$(group_of $L)
corepin report -o json > /tmp/h/rep 2> /tmp/h/err
say threaded run="$(allowed $R)" group="$G" type="$(cat $C$G/cgroup.type)" \
    cpus="$(cat $C$G/cpuset.cpus)" parent="$(cat $C/$P/cgroup.type)" tb=$(tracebacks) \
    statuses="$(statuses /tmp/h/rep)" \
    left="$(allowed $L)" leftgroup="$LG"
echo 0-15 > $C$G/cpuset.cpus; taskset -pc 0 $R > /dev/null
corepin reconcile --once -o json > /tmp/h/rec 2> /tmp/h/err; rc=$?
say threaded-reconcile rc=$rc tb=$(tracebacks) run="$(allowed $R)" cpus="$(cat $C$G/cpuset.cpus)"
kill $L; release th; corepin reconcile --once > /dev/null 2>&1
say threaded-after left="$(ls $C/$P | grep -c '^run-')"
clean

# 7. corepin's top group itself threaded
fresh; mkdir $C/corepin; echo threaded > $C/corepin/cgroup.type
corepin run --exclusive 4 --option numa=1 -- $PROBE self > /tmp/h/out 2> /tmp/h/err; rc=$?
say top-threaded rc=$rc err="$(err)" tb=$(tracebacks) \
    cpus="$(field cpus /tmp/h/out)"
clean

# 8. a threaded group elsewhere holds node 3's CPUs: a partition there is refused
fresh; mkdir -p $C/other/t; echo threaded > $C/other/t/cgroup.type
echo +cpuset > $C/other/cgroup.subtree_control; echo 12-15 > $C/other/t/cpuset.cpus
echo 12-15 > $C/other/cpuset.cpus
corepin run --exclusive 4 --option numa=3 --partition root -- \
    sh -c 'G=$(sed -n s/^0:://p /proc/self/cgroup); cat /sys/fs/cgroup$G/cpuset.cpus.partition; \
    sed -n "s/^Cpus_allowed_list:\t//p" /proc/self/status' > /tmp/h/out 2> /tmp/h/err; rc=$?
say partition-refused rc=$rc state="$(head -1 /tmp/h/out)" run="$(tail -1 /tmp/h/out)" \
    err="$(err)" tb=$(tracebacks)
rmdir $C/other/t $C/other
"""


def test_threaded_subtrees_get_threaded_run_groups_that_are_pinned_reported_and_reconciled(
    vm_numa4_smt2: Guest,
) -> None:
    got = run(vm_numa4_smt2, THREADED)
    th = got["threaded"]
    assert th["tb"] == "0", th
    assert th["parent"] == "threaded" and th["type"] == "threaded", th
    assert cpus(th["run"]) == cpus(th["cpus"]) and cpus(th["run"]) <= NODE_CPUS[2]
    assert len(cpus(th["run"])) == 2
    # the lingering process of the finished run is seen through the threaded group
    assert cpus(th["left"]) <= NODE_CPUS[0] and len(cpus(th["left"])) == 2
    assert th["leftgroup"].startswith("/corepin/sd-") and th["leftgroup"] != th["group"]
    assert th["statuses"].split() == ["lingering", "running"], th
    rec = got["threaded-reconcile"]
    assert rec["rc"] == "0" and rec["tb"] == "0", rec
    assert cpus(rec["run"]) == cpus(th["run"]) == cpus(rec["cpus"])
    assert got["threaded-after"]["left"] == "0"
    top = got["top-threaded"]
    assert top["rc"] == "0" and top["tb"] == "0", top
    assert cpus(top["cpus"]) == NODE_CPUS[1]
    refused = got["partition-refused"]
    assert refused["rc"] == "0" and refused["tb"] == "0", refused
    assert refused["state"] == "member" and cpus(refused["run"]) == NODE_CPUS[3]
    assert "partition root invalid" in refused["err"], refused
