"""Driver of `bench_run_latency.py`: runs `corepin ARGS...` in this interpreter with a clock
around its sub-steps, and writes where the time went to OUT.

The benchmark starts it as `python -c STUB OUT corepin-arguments...` where STUB (`STUB` below)
takes the time first and then imports this module (from its cached bytecode, so the driver's
own compilation does not count) and calls `main(T0)`.

Nothing in corepin is changed on disk and nothing is imported ahead of time: corepin's functions
are wrapped only once their module has been loaded by corepin itself (an import hook checks
after each import), so the import costs land where the command pays them. Time is charged to
the innermost wrapped step that is running (self time), per stage: `start` (up to CMD's exit)
and `release` (`Runner.finish`). Every `import` statement and `importlib.import_module` call
is one more step, `imports`, wherever it happens.

OUT gets lines `T0 <ns>`, `T1 <ns>` (corepin is done: its process only has to end) and
`<stage>\t<step>\t<ns>`, `COUNT\t<stage>\t<step>\t<fsync calls>`; CLOCK_MONOTONIC
is one clock for the whole machine, so the benchmark can set T0 against the moment it spawned
this interpreter.
"""

import builtins  # builtin, costs nothing
import os  # loaded by site already
import sys
import time

#: What the interpreter runs (`python -c STUB OUT ARGS...`); `{here}` is this directory.
STUB = (
    "import time; T0 = time.monotonic_ns(); import sys; sys.path.insert(0, {here!r}); "
    "import _run_phases; _run_phases.main(T0)"
)

_now = time.monotonic_ns


class Clock:
    def __init__(self) -> None:
        self.stack: list[tuple[str, str]] = [("start", "other")]
        self.last = _now()
        self.totals: dict[tuple[str, str], int] = {}
        self.counts: dict[tuple[str, str], int] = {}

    def _charge(self) -> None:
        t = _now()
        key = self.stack[-1]
        self.totals[key] = self.totals.get(key, 0) + t - self.last
        self.last = t

    def enter(self, step: str, stage: str | None = None) -> None:
        self._charge()
        self.stack.append((stage or self.stack[-1][0], step))

    def leave(self) -> None:
        self._charge()
        self.stack.pop()


CLOCK = Clock()


def _timed(func, step, stage=None):  # type: ignore[no-untyped-def]
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        CLOCK.enter(step, stage)
        try:
            return func(*args, **kwargs)
        finally:
            CLOCK.leave()

    wrapper.__wrapped__ = func  # type: ignore[attr-defined]
    return wrapper


#: (module, attribute path, step, stage or None). An attribute of a class may be a function,
#: classmethod, staticmethod or property (its getter is timed). A target that no longer exists
#: is reported, so the benchmark says when it has gone stale.
TARGETS: list[tuple[str, str, str, str | None]] = [
    ("argparse", "ArgumentParser.parse_args", "parse arguments", None),
    ("corepin.cli.main", "build_parser", "parse arguments", None),
    ("corepin.agent.host.settings", "HostSettings.from_args", "parse arguments", None),
    ("corepin.topology.discover", "discover", "topology", None),
    ("corepin.state.store", "StateStore._open", "lock", None),
    ("corepin.state.store", "StateStore._acquire", "lock", None),
    ("corepin.state.store", "read_checkpoint", "load checkpoint", None),
    ("corepin.state.store", "remove_temp_files", "load checkpoint", None),
    ("corepin.state.store", "_stamp", "load checkpoint", None),
    ("corepin.state.transaction", "adopt", "validate", None),
    ("corepin.sysfs.procfs", "process_table", "/proc reads", None),
    ("corepin.sysfs.procfs", "process_start_time", "/proc reads", None),
    ("corepin.agent.host.liveness", "Liveness.status", "liveness", None),
    ("corepin.agent.host.agent", "HostAgent.decide", "decide", None),
    ("corepin.agent.host.agent", "HostAgent.decide_cpus", "decide", None),
    ("corepin.agent.host.agent", "HostAgent.with_reserved", "decide", None),
    ("corepin.agent.host.pinning", "Pinner.cgroups_enabled", "cgroup set-up", None),
    ("corepin.agent.host.pinning", "Pinner.prepare", "cgroup set-up", None),
    ("corepin.agent.host.launch", "Launch.start", "fork", None),
    ("corepin.state.store", "Transaction.commit", "commit", None),
    ("corepin.agent.host.agent", "HostAgent.repin_shared", "re-pin shared", None),
    ("corepin.agent.host.launch", "Launch.go", "exec CMD", None),
    ("corepin.agent.host.launch", "Launch.wait", "CMD runs", None),
    ("corepin.agent.host.run", "Runner.finish", "other", "release"),
    ("corepin.agent.host.agent", "HostAgent.remove_cgroups", "cgroup removal", None),
]
_pending = list(TARGETS)
_seen_modules = 0
missing: list[str] = []


def _patch_one(module: object, path: str, step: str, stage: str | None) -> bool:
    owner: object = module
    *parents, name = path.split(".")
    for part in parents:
        owner = getattr(owner, part, None)
        if owner is None:
            return False
    raw = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if raw is None:
        return False
    if isinstance(raw, classmethod):
        new: object = classmethod(_timed(raw.__func__, step, stage))
    elif isinstance(raw, staticmethod):
        new = staticmethod(_timed(raw.__func__, step, stage))
    elif isinstance(raw, property):
        new = property(_timed(raw.fget, step, stage), raw.fset, raw.fdel, raw.__doc__)
    elif callable(raw):
        new = _timed(raw, step, stage)
    else:
        return False
    setattr(owner, name, new)
    return True


def _patch_loaded() -> None:
    global _seen_modules
    if len(sys.modules) == _seen_modules:
        return
    _seen_modules = len(sys.modules)
    still = []
    for target in _pending:
        module = sys.modules.get(target[0])
        if module is None or getattr(module, "__spec__", None) is None:
            still.append(target)
            continue
        if getattr(module.__spec__, "_initializing", False):
            still.append(target)  # still running its body: patch when it has finished
            continue
        if not _patch_one(module, *target[1:]):
            missing.append(f"{target[0]}.{target[1]}")
    _pending[:] = still


_original_import = builtins.__import__
_depth = 0


def _import(*args, **kwargs):  # type: ignore[no-untyped-def]
    global _depth
    CLOCK.enter("imports")
    _depth += 1
    try:
        return _original_import(*args, **kwargs)
    finally:
        _depth -= 1
        if _depth == 0:
            _patch_loaded()
        CLOCK.leave()


builtins.__import__ = _import


def _fsync(fd: int) -> None:
    CLOCK.enter("fsync")
    key = CLOCK.stack[-1]
    CLOCK.counts[key] = CLOCK.counts.get(key, 0) + 1
    try:
        _real_fsync(fd)
    finally:
        CLOCK.leave()


_real_fsync = os.fsync
os.fsync = _fsync


def _import_module_patch() -> None:
    import importlib

    real = importlib.import_module

    def import_module(name, package=None):  # type: ignore[no-untyped-def]
        global _depth
        CLOCK.enter("imports")
        _depth += 1
        try:
            return real(name, package)
        finally:
            _depth -= 1
            if _depth == 0:
                _patch_loaded()
            CLOCK.leave()

    importlib.import_module = import_module


def _write(out: str, t0: int, code: object) -> None:
    CLOCK._charge()
    lines = [f"T0 {t0}", f"CODE {code}"]
    lines += [f"MISSING {name}" for name in missing + [f"{t[0]}.{t[1]}" for t in _pending]]
    lines += [f"{stage}\t{step}\t{ns}" for (stage, step), ns in CLOCK.totals.items()]
    lines += [f"COUNT\t{stage}\t{step}\t{n}" for (stage, step), n in CLOCK.counts.items()]
    with open(out, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n" + f"T1 {_now()}\n")


def main(t0: int) -> None:
    out = sys.argv[1]
    sys.argv = ["corepin", *sys.argv[2:]]
    if "importlib" in sys.modules:
        _import_module_patch()
    else:
        TARGETS.append(("importlib", "import_module", "imports", None))
        _pending.append(TARGETS[-1])
    real_exit = os._exit

    def _exit(code: int) -> None:  # corepin ends its process itself: write down first
        _write(out, t0, code)
        real_exit(code)

    os._exit = _exit
    CLOCK.last = _now()
    CLOCK.totals[("start", "driver set-up")] = CLOCK.last - t0
    code = 0
    try:
        from corepin.__main__ import entry

        code = entry()
    finally:
        _write(out, t0, code)
    sys.exit(code)
