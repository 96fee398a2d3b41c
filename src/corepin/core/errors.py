"""One error hierarchy for corepin.

```
CorepinError                       every error corepin raises on purpose; has .reason and .exit_code
+-- InputError                     bad input or usage (exit 2)
|   +-- CPUSetParseError           also a ValueError: malformed CPU list / mask text
|   +-- TopologyError              also a ValueError: inconsistent topology description
|   +-- RequestError               also a ValueError: a request that makes no sense (count 0, ...)
|   +-- StateFormatError           unreadable state file (corrupt, unknown version)
+-- AllocationError                the request is valid but cannot be satisfied (exit 3)
|   +-- SMTAlignmentError          kubelet full-pcpus-only alignment failures
+-- EnvironmentProblem             the host is not usable as configured (exit 4)
    +-- SysfsError                 a required sysfs file is missing or unreadable (names the path)
    +-- CgroupError                a cgroup write or read failed (names the path and the errno)
    +-- StateError                 state directory not usable (permission, unsafe restored state)
```

Errors carry fields and build their message from them. `reason` is a short machine-readable
token (snake case); the message is for people.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_INPUT = 2
EXIT_UNSATISFIABLE = 3
EXIT_ENVIRONMENT = 4


class CorepinError(Exception):
    """Base of every error corepin raises on purpose."""

    exit_code: int = EXIT_INTERNAL
    default_reason: str = "error"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason

    def __str__(self) -> str:
        return self.message


class InputError(CorepinError):
    """Bad input or usage: exit 2."""

    exit_code = EXIT_INPUT
    default_reason = "bad_input"


class CPUSetParseError(InputError, ValueError):
    """Malformed CPU list or mask text; names the offending text."""

    default_reason = "bad_cpuset"

    def __init__(self, text: str, problem: str) -> None:
        self.text = text
        self.problem = problem
        super().__init__(f"invalid CPU set {text!r}: {problem}")


class TopologyError(InputError, ValueError):
    """A topology description that is inconsistent (duplicate CPU, CPU in two cores, ...)."""

    default_reason = "bad_topology"


class RequestError(InputError, ValueError):
    """A request that makes no sense (count <= 0, unknown option, ...)."""

    default_reason = "bad_request"


class StateFormatError(InputError):
    """A state file that cannot be understood (corrupt, truncated, unknown version)."""

    default_reason = "bad_state_file"


class AllocationError(CorepinError):
    """A valid request that cannot be satisfied: exit 3."""

    exit_code = EXIT_UNSATISFIABLE
    default_reason = "unsatisfiable"


class SMTAlignmentError(AllocationError):
    """The kubelet's full-pcpus-only SMT alignment failures."""

    default_reason = "smt_alignment"


class EnvironmentProblem(CorepinError):
    """The host cannot be used as configured: exit 4."""

    exit_code = EXIT_ENVIRONMENT
    default_reason = "environment"


class SysfsError(EnvironmentProblem):
    """A required sysfs file is missing or unreadable."""

    default_reason = "sysfs"

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


class CgroupError(EnvironmentProblem):
    """A cgroup operation failed; names the path and what went wrong."""

    default_reason = "cgroup"

    def __init__(self, path: str, problem: str, *, reason: str | None = None) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}", reason=reason)


class StateError(EnvironmentProblem):
    """The state directory cannot be used, or restored state is unsafe to use."""

    default_reason = "state"
