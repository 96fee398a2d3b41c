"""Memory placement of a command: `set_mempolicy(2)` with MPOL_BIND, MPOL_INTERLEAVE or
MPOL_PREFERRED.

A process pinned by affinity alone may still take its memory from any NUMA node. The Linux
`set_mempolicy(2)` syscall sets the calling thread's policy for its future allocations; the
policy is inherited across `fork` and kept across `execve`, so the launcher calls it in the child
just before `exec` and the whole command tree inherits it. The three modes are numactl's:
`bind` (`--membind`: only these nodes), `interleave` (`--interleave`: page by page across these
nodes) and `preferred` (`--preferred`: this one node first, any other when it is full).

glibc does not export `set_mempolicy` (libnuma does), so the call goes through libc's
`syscall(2)` with the syscall number of the running architecture. `ctypes` is imported only
here, and this module is only imported when a run actually binds memory (start-up latency).

`prepare_bind(nodes)` does the slow parts (loading libc, building the node mask) up front and
returns a callable that only makes the syscall and raises `OSError`, which is what a forked
child between `fork` and `exec` wants; `bind_memory(nodes)` is the one-step form that raises
`MemoryPolicyError`.
"""

from __future__ import annotations

import errno as errno_codes
import os
from collections.abc import Callable

from corepin.core.cpuset import CPUSet
from corepin.core.errors import EnvironmentProblem

__all__ = [
    "MODES",
    "MPOL_BIND",
    "MPOL_INTERLEAVE",
    "MPOL_PREFERRED",
    "MemoryPolicy",
    "MemoryPolicyError",
    "bind_memory",
    "nodemask",
    "prepare_bind",
    "prepare_policy",
    "syscall_number",
]

#: `mode` values of set_mempolicy(2) (linux/mempolicy.h): prefer one node, restrict to the
#: nodes, spread page by page over the nodes.
MPOL_PREFERRED = 1
MPOL_BIND = 2
MPOL_INTERLEAVE = 3
#: policy name (as numactl spells its options) -> set_mempolicy mode
MODES = {"bind": MPOL_BIND, "interleave": MPOL_INTERLEAVE, "preferred": MPOL_PREFERRED}
#: Bits in one `unsigned long` of the node mask (64-bit Linux ABIs only).
WORD_BITS = 64
#: `set_mempolicy` by `os.uname().machine` (arch/*/syscall tables; riscv64 and aarch64 use the
#: generic table).
SYSCALL_NUMBERS = {
    "x86_64": 238,
    "aarch64": 237,
    "arm64": 237,
    "riscv64": 237,
    "ppc64le": 261,
    "ppc64": 261,
    "s390x": 270,
}


class MemoryPolicyError(EnvironmentProblem):
    """set_mempolicy refused (or cannot be called here); names the nodes and the errno."""

    default_reason = "membind_failed"

    def __init__(self, nodes: CPUSet, problem: str, *, errno: int = 0) -> None:
        self.nodes = nodes
        self.errno = errno
        self.problem = problem
        super().__init__(f"cannot bind memory to NUMA node(s) {nodes or '(none)'}: {problem}")

    @classmethod
    def from_errno(cls, nodes: CPUSet, code: int, text: str = "") -> MemoryPolicyError:
        """The error for a failed syscall, with a hint for the errnos that have a known cause."""
        name = errno_codes.errorcode.get(code, f"errno {code}")
        detail = text or os.strerror(code)
        if code == errno_codes.EINVAL:
            hint = "a node does not exist, has no memory, or lies outside the allowed mems"
            return cls(nodes, f"{name} ({detail}): {hint}", errno=code)
        if code == errno_codes.ENOSYS:
            hint = "the kernel was built without NUMA support"
            return cls(nodes, f"{name} ({detail}): {hint}", errno=code)
        return cls(nodes, f"{name} ({detail})", errno=code)


def nodemask(nodes: CPUSet) -> tuple[list[int], int]:
    """(mask words, maxnode) for set_mempolicy: one 64-bit word per 64 node ids, node n at bit
    n % 64 of word n // 64; `maxnode` is the bit count plus one (the kernel reads maxnode - 1
    bits, as libnuma passes it)."""
    if not nodes:
        raise MemoryPolicyError(nodes, "no NUMA node given")
    bits = nodes.bits
    count = (bits.bit_length() + WORD_BITS - 1) // WORD_BITS
    mask = (1 << WORD_BITS) - 1
    words = [(bits >> (WORD_BITS * i)) & mask for i in range(count)]
    return words, count * WORD_BITS + 1


def syscall_number(machine: str) -> int:
    """The set_mempolicy syscall number on `machine` (as `uname -m` prints it)."""
    number = SYSCALL_NUMBERS.get(machine)
    if number is None:
        known = ", ".join(sorted(SYSCALL_NUMBERS))
        raise EnvironmentProblem(
            f"binding memory is not supported on architecture {machine!r} (known: {known})",
            reason="membind_unsupported",
        )
    return number


class MemoryPolicy:
    """A memory policy for a command: `mode` (bind, interleave, preferred) over `nodes`."""

    __slots__ = ("mode", "nodes")

    def __init__(self, mode: str, nodes: CPUSet) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown memory policy {mode!r} (one of {', '.join(MODES)})")
        if not nodes:
            raise MemoryPolicyError(nodes, "no NUMA node given")
        if mode == "preferred" and len(nodes) != 1:
            raise MemoryPolicyError(nodes, "--preferred takes exactly one NUMA node")
        self.mode = mode
        self.nodes = nodes

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MemoryPolicy) and (self.mode, self.nodes) == (
            other.mode,
            other.nodes,
        )

    def __hash__(self) -> int:
        return hash((self.mode, self.nodes))

    def __repr__(self) -> str:
        return f"MemoryPolicy({self.mode!r}, {str(self.nodes)!r})"

    def __str__(self) -> str:
        return f"{self.mode}:{self.nodes}"


def prepare_bind(nodes: CPUSet) -> Callable[[], None]:
    """A callable that binds the calling thread's memory to `nodes`; it raises OSError (with
    the errno) and does nothing else, so it is safe between fork and exec."""
    return prepare_policy(MemoryPolicy("bind", nodes))


def prepare_policy(policy: MemoryPolicy) -> Callable[[], None]:
    """A callable that sets the calling thread's memory policy to `policy`; it raises OSError
    (with the errno) and does nothing else, so it is safe between fork and exec."""
    import ctypes

    words, maxnode = nodemask(policy.nodes)
    number = syscall_number(os.uname().machine)
    libc = ctypes.CDLL(None, use_errno=True)
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    array = (ctypes.c_ulong * len(words))(*words)
    args = (
        ctypes.c_long(number),
        ctypes.c_int(MODES[policy.mode]),
        array,
        ctypes.c_ulong(maxnode),
    )

    def bind() -> None:
        if syscall(*args) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))

    return bind


def bind_memory(nodes: CPUSet) -> None:
    """Bind the calling thread's future memory allocations to the NUMA `nodes` (MPOL_BIND);
    MemoryPolicyError naming the nodes and the errno when the kernel refuses."""
    bind = prepare_bind(nodes)
    try:
        bind()
    except OSError as err:
        raise MemoryPolicyError.from_errno(nodes, err.errno or 0, err.strerror or "") from err
