#!/bin/sh
# Before and after in one run: the same benchmarks for another revision and for this checkout,
# one after the other on the same machine, so that the two sets of figures can be compared.
#
#   sh benchmarks/before_after.sh REV [SCRIPT [ARGS...]]
#
# REV is any git revision (a commit, a tag, main~3). Its tree is unpacked into a temp directory
# and each benchmark is run from there (its own benchmark scripts, its own src/ first on the
# path: benchmarks of another revision may import modules this one renamed), then from this
# checkout. With no SCRIPT: the start-up of `corepin run` (bench_run_latency.py), the node
# agent's event -> pinned (bench_agent.py --quick) and the extender and scheduler
# (bench_placement.py --quick). Nothing is installed; the temp tree is removed afterwards.
set -eu
cd "$(dirname "$0")/.."
if [ "$#" -lt 1 ]; then
    echo "usage: sh benchmarks/before_after.sh REV [SCRIPT [ARGS...]]" >&2
    exit 2
fi
rev=$1
shift
if ! git rev-parse --verify --quiet "$rev^{commit}" > /dev/null; then
    echo "before_after: '$rev' is not a revision of this repository" >&2
    exit 2
fi
PY=${PYTHON:-.venv/bin/python}
old=$(mktemp -d "${TMPDIR:-/tmp}/corepin-before.XXXXXX")
trap 'rm -rf "$old"' EXIT INT TERM
git archive "$rev" | tar -x -C "$old"
# The gRPC modules are generated at install time, not kept in git: the other revision gets this
# checkout's when its protos are the same (the agent serves gRPC; without them it cannot start).
if git diff --quiet "$rev" HEAD -- proto; then
    cp -r src/corepin/api/grpc/gen "$old/src/corepin/api/grpc/"
else
    echo "before_after: the protos of $rev differ from this checkout's: the node agent's" \
        "figures of $rev need its own installed checkout" >&2
fi

run_pair() {  # $@: the benchmark script (relative to the repository root) and its arguments
    script=$1
    shift
    echo "==================== before: $rev - $script $*"
    (PYTHONPATH="$old/src" "$PY" "$old/$script" "$@") || echo "(before: exit $?)"
    echo "==================== after: $(git rev-parse --short HEAD) (this checkout) - $script $*"
    "$PY" "$script" "$@" || echo "(after: exit $?)"
}

if [ "$#" -gt 0 ]; then
    run_pair "$@"
else
    run_pair benchmarks/bench_run_latency.py --repeat 21
    run_pair benchmarks/bench_agent.py --quick
    run_pair benchmarks/bench_placement.py --quick
fi
