"""Starting CMD: fork, hold the child until its allocation is committed, pin it, exec.

`Launch.start()` forks a child that sets its own CPU affinity and environment and then waits
on a "go" pipe. The parent records the child (pid and start time) in the state, commits, and
only then calls `go()`: the child execs CMD. When the parent dies before `go()` the child reads
end-of-file and exits without ever running CMD, so a command never runs unrecorded. An `exec`
failure (command not found, not executable) travels back over a close-on-exec pipe and becomes
exit 127 or 126, as in a shell.

The whole process tree inherits the affinity: it is set in the child before `exec`, and every
process CMD forks starts with it. The child joins its cgroup (when it has one) before it sets
its affinity, because the cgroup it inherits - a shield's system set, say - may not allow the
CPUs it gets. With `new_session` the child leads a session of its own
(`setsid`), so every process CMD starts - even one that outlives CMD - is found by its session
id; corepin's termination signals then go to CMD's whole process group. `sigmask`, when given,
is the signal mask CMD starts with (the parent blocks termination signals while it commits).
With `bind_mems` the child also binds its memory to those NUMA nodes (`set_mempolicy(MPOL_BIND)`,
see `corepin.enforcement.mempolicy`), which is inherited the same way; used for runs without a
cpuset cgroup, whose `cpuset.mems` would do it otherwise. With `memory` (a `MemoryPolicy` the
user asked for: `--membind`, `--interleave`, `--preferred`) the child sets that policy instead.
`also_join` are more cgroup files the child writes its pid into after its cgroup (cgroup v1's
cpu and cpuacct hierarchies); `resctrl_tasks` is the `tasks` file of its QoS class's resctrl
group, written before exec so every thread CMD makes inherits the class (a failure there is
left to `corepin reconcile`, which writes every thread of every run to its class's group).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from corepin.core.cpuset import CPUSet
from corepin.core.errors import CgroupError, CorepinError, EnvironmentProblem, InputError

if TYPE_CHECKING:
    from corepin.enforcement.mempolicy import MemoryPolicy

#: Signals forwarded from corepin to CMD while it runs.
FORWARDED: tuple[signal.Signals, ...] = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


class CommandError(CorepinError):
    """CMD could not be executed (exit code 127 not found, 126 not executable)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message, reason="exec_failed")
        self.exit_code = exit_code


class Launch:
    """A forked child waiting to exec `argv` on `cpus` with `env` added to its environment."""

    def __init__(
        self,
        argv: Sequence[str],
        cpus: CPUSet,
        env: Mapping[str, str],
        *,
        cgroup_procs: str | None = None,
        also_join: Sequence[str] = (),
        resctrl_tasks: str | None = None,
        bind_mems: CPUSet | None = None,
        memory: MemoryPolicy | None = None,
        new_session: bool = False,
        sigmask: set[int | signal.Signals] | None = None,
    ) -> None:
        if not argv:
            raise InputError("no command given: use `corepin run [options] -- CMD ARGS...`")
        if not cpus:
            raise InputError("refusing to start a command on an empty CPU set", reason="no_cpus")
        self.argv = list(argv)
        self.cpus = cpus
        self.env = dict(env)
        #: `cgroup.procs` (or, on cgroup v1, `tasks`: the child writes 0, its only thread) file
        #: the child writes itself into before it waits for "go" (so the kernel's cgroup attach
        #: overlaps with the parent's checkpoint commit)
        self.cgroup_procs = cgroup_procs
        #: more cgroup files (cgroup v1's cpu and cpuacct hierarchies) the child joins
        self.also_join = tuple(also_join)
        #: the resctrl group's `tasks` file the child writes itself into (best effort)
        self.resctrl_tasks = resctrl_tasks
        #: NUMA nodes the child binds its memory to before exec (None: leave the policy alone)
        self.bind_mems = bind_mems
        #: a memory policy the child sets before exec (wins over `bind_mems`)
        self.memory = memory
        #: the child leads a new session (and process group) of its own
        self.new_session = new_session
        #: the signal mask the child execs with (None: the one it inherits)
        self.sigmask = sigmask
        self.pid = 0
        self._go_w = -1
        self._err_r = -1
        self._previous: dict[signal.Signals, Any] = {}

    def start(self) -> int:
        """Fork the child (held before exec); returns its pid. EnvironmentProblem when the
        host refuses a pipe or a process (descriptor or process limits)."""
        environ = dict(os.environ)
        environ.update(self.env)
        cpus = self.cpus.sorted()
        procs = self.cgroup_procs
        # a v1 `tasks` file takes 0 for "this thread" (the child has one: moving it moves the
        # process), which the kernel moves without its system-wide thread-group write lock
        by_thread = procs is not None and os.path.basename(procs) == "tasks"
        new_session = self.new_session
        sigmask = self.sigmask
        also_join = self.also_join
        resctrl_tasks = self.resctrl_tasks
        bind = None
        if self.memory is not None:
            from corepin.enforcement.mempolicy import prepare_policy

            bind = prepare_policy(self.memory)
        elif self.bind_mems is not None:
            # ctypes and libc are loaded here, in the parent, only for runs that bind memory
            from corepin.enforcement.mempolicy import prepare_bind

            bind = prepare_bind(self.bind_mems)
        sys.stdout.flush()
        sys.stderr.flush()
        opened: list[int] = []
        try:
            go_r, go_w = os.pipe()
            opened += (go_r, go_w)
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            opened += (err_r, err_w)
            pid = os.fork()
        except OSError as exc:
            for fd in opened:
                os.close(fd)
            raise EnvironmentProblem(
                f"cannot start {self.argv[0]!r}: {exc.strerror or exc}", reason="fork_failed"
            ) from exc
        if pid == 0:  # child: never returns
            stage = "affinity"
            try:
                os.close(go_w)
                os.close(err_r)
                for sig in FORWARDED:
                    signal.signal(sig, signal.SIG_DFL)
                if new_session:
                    os.setsid()
                if procs is not None:
                    # the cgroup first: outside it the CPUs may not be allowed at all (a cpuset
                    # partition takes them away from every other group; the caller's own cpuset,
                    # a shield's system set, does not hold them)
                    stage = "cgroup"
                    fd = os.open(procs, os.O_WRONLY)
                    try:
                        os.write(fd, b"0" if by_thread else str(os.getpid()).encode())
                    finally:
                        os.close(fd)
                for extra in also_join:
                    stage = "cgroup"
                    fd = os.open(extra, os.O_WRONLY)
                    try:
                        os.write(fd, str(os.getpid()).encode())
                    finally:
                        os.close(fd)
                if resctrl_tasks is not None:
                    try:
                        fd = os.open(resctrl_tasks, os.O_WRONLY | os.O_APPEND)
                        try:
                            os.write(fd, str(os.getpid()).encode() + b"\n")
                        finally:
                            os.close(fd)
                    except OSError:
                        pass  # reconcile writes it later
                stage = "affinity"
                os.sched_setaffinity(0, cpus)
                if bind is not None:
                    stage = "mempolicy"
                    bind()
                if os.read(go_r, 1) != b"1":
                    os._exit(125)
                os.close(go_r)
                if sigmask is not None:
                    signal.pthread_sigmask(signal.SIG_SETMASK, sigmask)
                stage = "exec"
                os.execvpe(self.argv[0], self.argv, environ)
            except OSError as exc:
                try:
                    text = f"{stage}:{exc.errno or 0}:{exc.strerror or exc}"
                    os.write(err_w, text.encode())
                finally:
                    os._exit(127)
            except BaseException:
                os._exit(127)
            os._exit(127)  # pragma: no cover - execvpe does not return
        os.close(go_r)
        os.close(err_w)
        self.pid = pid
        self._go_w = go_w
        self._err_r = err_r
        return pid

    def go(self) -> None:
        """Let the child exec CMD. Raises CommandError when exec fails (child already reaped).

        From here on corepin's termination signals are forwarded to the child (to its process
        group when it leads a session of its own) until `wait()` returns."""
        target = -self.pid if self.new_session else self.pid

        def forward(signum: int, _frame: FrameType | None) -> None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(target, signum)

        self._previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
        try:
            os.write(self._go_w, b"1")
        except BrokenPipeError:
            pass
        finally:
            os.close(self._go_w)
            self._go_w = -1
        chunks = []
        while True:
            chunk = os.read(self._err_r, 512)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(self._err_r)
        self._err_r = -1
        if chunks:
            text = b"".join(chunks).decode(errors="replace")
            stage, _, rest = text.partition(":")
            code_text, _, message = rest.partition(":")
            os.waitpid(self.pid, 0)
            self._restore()
            code = int(code_text) if code_text.isdigit() else 0
            if stage == "cgroup":
                raise CgroupError(
                    self.cgroup_procs or "cgroup.procs",
                    f"cannot move the command into its cgroup: {message}",
                    reason="cgroup_attach_failed",
                )
            if stage == "affinity":
                raise EnvironmentProblem(
                    f"cannot pin {self.argv[0]!r} to CPUs {self.cpus}: {message}",
                    reason="affinity_failed",
                )
            if stage == "mempolicy":
                from corepin.enforcement.mempolicy import MemoryPolicyError

                nodes = self.memory.nodes if self.memory is not None else self.bind_mems
                raise MemoryPolicyError.from_errno(nodes or CPUSet(), code, message)
            exit_code = 127 if code in (errno.ENOENT, errno.ENOTDIR) else 126
            raise CommandError(f"cannot run {self.argv[0]!r}: {message}", exit_code)

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def abort(self) -> None:
        """Make the held child exit without running CMD (the allocation failed to commit)."""
        if self._go_w >= 0:
            os.close(self._go_w)
            self._go_w = -1
        if self._err_r >= 0:
            os.close(self._err_r)
            self._err_r = -1
        if self.pid:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)

    def wait(self) -> int:
        """Wait for CMD, forwarding corepin's signals to it; its exit code (128+N if killed)."""
        pid = self.pid
        try:
            while True:
                try:
                    _, status = os.waitpid(pid, 0)
                except ChildProcessError:
                    return 0
                if os.WIFEXITED(status) or os.WIFSIGNALED(status):
                    break
        finally:
            self._restore()
        code = os.waitstatus_to_exitcode(status)
        return 128 - code if code < 0 else code
