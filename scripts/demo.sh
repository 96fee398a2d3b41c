#!/bin/sh
# The end-to-end demo of standalone host mode on this machine (called by `make demo`):
#   1. this machine's topology (table + SVG picture);
#   2. two shared workloads (`corepin run --shared`) and one pinned exclusive workload
#      (`corepin run --exclusive 1`) running side by side in the background;
#   3. where each of them really runs (Cpus_allowed_list from /proc), the report table and an
#      SVG of the topology coloured by owner;
#   4. everything stopped again: the allocations are released and the shared pool grows back.
# State lives in ./.corepin-demo (override with COREPIN_DEMO_STATE); pictures go to $DEMO_DIR.
set -eu

COREPIN=${COREPIN:-.venv/bin/corepin}
DEMO_DIR=${DEMO_DIR:-build}
STATE=${COREPIN_DEMO_STATE:-./.corepin-demo}
HOLD=${COREPIN_DEMO_SECONDS:-30}

mkdir -p "$DEMO_DIR" "$STATE"
export COREPIN_STATE_DIR="$STATE"
pids=""

cleanup() {
    for pid in $pids; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in $pids; do wait "$pid" 2>/dev/null || true; done
    pids=""
}
trap cleanup EXIT INT TERM

step() { printf '\n== %s\n' "$*"; }

allowed() {  # Cpus_allowed_list of a pid
    sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "/proc/$1/status" 2>/dev/null || echo "(gone)"
}

# one field of every allocation in `corepin report -o json` (read as JSON, by the Python that
# runs corepin), one per line
PY=$(dirname "$COREPIN")/python
[ -x "$PY" ] || PY=python3
report_field() {
    "$PY" -c 'import json, sys
for a in json.load(sys.stdin)["allocations"]:
    if a.get(sys.argv[1]) is not None:
        print(a[sys.argv[1]])' "$1"
}

wait_for_allocations() {  # until the report lists $1 allocations (at most ~10 s)
    n=0
    while [ "$n" -lt 100 ]; do
        count=$("$COREPIN" report -o json | report_field id | wc -l)
        [ "$count" -ge "$1" ] && return 0
        sleep 0.1
        n=$((n + 1))
    done
    echo "demo: timed out waiting for $1 allocations" >&2
    return 1
}

step "this machine"
"$COREPIN" topology
"$COREPIN" topology -o svg --out "$DEMO_DIR/topology-this-machine.svg"
echo "picture: $DEMO_DIR/topology-this-machine.svg"

"$COREPIN" reconcile --once >/dev/null  # free what an earlier, interrupted demo left behind
cpus=$(getconf _NPROCESSORS_ONLN)

step "two shared workloads: corepin run --shared -- sleep $HOLD"
"$COREPIN" run --shared --name web -- sleep "$HOLD" &
pids="$pids $!"
"$COREPIN" run --shared --name batch -- sleep "$HOLD" &
pids="$pids $!"
wait_for_allocations 2
"$COREPIN" report

if [ "$cpus" -ge 2 ]; then
    step "one pinned workload beside them: corepin run --exclusive 1 -- ..."
    "$COREPIN" run --exclusive 1 --name latency -- sh -c \
        'echo "latency: COREPIN_CPUS=$COREPIN_CPUS COREPIN_MEMS=$COREPIN_MEMS, runs on CPUs $(sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" /proc/self/status)"; exec sleep '"$HOLD" &
    pids="$pids $!"
    wait_for_allocations 3
    sleep 0.2
else
    echo "(one CPU only: an exclusive run would leave the shared workloads no CPU; skipped)"
fi

step "corepin report: who holds which CPUs (the shared workloads were re-pinned)"
"$COREPIN" report
echo
"$COREPIN" report -o json | report_field pid | while read -r pid; do
    echo "pid $pid ($(cat "/proc/$pid/comm" 2>/dev/null || echo gone)) is allowed on CPUs $(allowed "$pid")"
done
"$COREPIN" report -o svg --out "$DEMO_DIR/report-this-machine.svg"
echo "picture coloured by owner: $DEMO_DIR/report-this-machine.svg"

step "stopping the workloads: allocations are released, the shared pool grows back"
cleanup
"$COREPIN" report
