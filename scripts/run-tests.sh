#!/bin/sh
# The test suite as `make test` runs it. With no arguments the guest tests (marker `vm`: QEMU
# guests, one emulator thread that mostly keeps one core busy) run in a second pytest process
# beside the rest, so that the two halves overlap on a small machine; their output follows the
# first half's. With arguments: one pytest with exactly those arguments.
# Both halves must pass, and exit 5 (no tests collected) is a failure, not a pass.
set -u
PYTEST=${PYTEST:-.venv/bin/pytest}

verdict() {  # $1: pytest's exit code, $2: which run
    if [ "$1" -eq 5 ]; then
        echo "pytest collected no tests ($2): failing" >&2
        return 1
    fi
    return "$1"
}

if [ "$#" -gt 0 ]; then
    "$PYTEST" "$@"
    verdict $? "pytest $*"
    exit $?
fi

mkdir -p build
log=build/pytest-vm.log
"$PYTEST" -m vm -p no:cacheprovider > "$log" 2>&1 &
guests=$!
trap 'kill "$guests" 2> /dev/null' INT TERM
"$PYTEST" -m "not vm"
rest=$?
wait "$guests"
vm=$?
echo
echo "================ the guest tests (pytest -m vm, ran beside the rest) ================"
cat "$log"
status=0
verdict "$rest" "the tests outside guests" || status=1
verdict "$vm" "the guest tests" || status=1
exit "$status"
