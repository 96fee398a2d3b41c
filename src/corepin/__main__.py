"""`python -m corepin`, and the `corepin` console script (`entry`)."""

from __future__ import annotations


def entry() -> int:
    """Run the command line; a Ctrl-C while corepin's modules are still loading is the same
    quiet exit 130 as one later on."""
    try:
        from corepin.cli.main import main
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt) or isinstance(
            exc.__cause__ or exc.__context__, KeyboardInterrupt
        ):
            return 130
        raise
    code = main()
    # The process ends now: nothing is left for the collector to find, but Python's shutdown
    # would still walk every object corepin made (milliseconds on each `corepin run`). Frozen
    # objects are left to the end of the process; exit handlers and flushing run as before.
    import gc

    gc.freeze()
    _end_run(code)
    return code


def _end_run(code: int) -> None:
    """After `corepin run`, end the process at once when Python's shutdown has nothing left to
    do but free memory (which the kernel does faster): no exit handler registered, no other
    thread, no tracer or profiler (coverage, cProfile) attached, and the standard streams
    flushed. Otherwise return, and the normal shutdown runs. `run` writes nothing through
    buffered files of its own (its checkpoint and cgroup files are written through
    descriptors), so nothing else is waiting to be flushed."""
    import os
    import sys

    first = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    if first != "run" or not 0 <= code <= 255:
        return
    import atexit

    threading = sys.modules.get("threading")
    if (
        atexit._ncallbacks()
        or sys.gettrace() is not None
        or sys.getprofile() is not None
        or (threading is not None and threading.active_count() > 1)
    ):
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return  # the normal shutdown reports it
    os._exit(code)


#: Options of `corepin report` that take a value (the plugin must not read it as the node name).
_REPORT_VALUE_OPTIONS = frozenset({"-o", "--output", "--out", "--kubeconfig", "--context"})
_PLUGIN_USAGE = """\
usage: kubectl corepin report NODE [-o table|json|yaml|svg] [--out FILE] [--kubeconfig FILE]
                                   [--context NAME]

Show who holds which CPUs on a Kubernetes node, from its NodeCPUTopology (the same as
`corepin report --node NODE`). The API is the one kubectl uses: --kubeconfig, else
$KUBECONFIG, else ~/.kube/config; --context picks a context other than the current one.
"""


def plugin_argv(args: list[str]) -> list[str] | None:
    """The `corepin` command line for `kubectl corepin ARGS` (None: show the usage):
    `report NODE [OPTIONS]` becomes `report --node NODE [OPTIONS]`."""
    if not args or args[0] != "report" or any(a in ("-h", "--help") for a in args):
        return None
    rest = args[1:]
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg in _REPORT_VALUE_OPTIONS:
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        return ["report", "--node", arg, *rest[:i], *rest[i + 1 :]]
    return None


def kubectl_plugin() -> int:
    """The `kubectl-corepin` console script: kubectl runs it for `kubectl corepin ...`."""
    import sys

    argv = plugin_argv(sys.argv[1:])
    if argv is None:
        wanted = any(a in ("-h", "--help") for a in sys.argv[1:])
        (sys.stdout if wanted else sys.stderr).write(_PLUGIN_USAGE)
        return 0 if wanted else 2
    try:
        from corepin.cli.main import main
    except KeyboardInterrupt:
        return 130
    return main(argv)


if __name__ == "__main__":
    raise SystemExit(entry())
