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
    +-- KubeConfigError            kubeconfig / service account unusable (names the file or key)
    +-- ApiUnreachable             the Kubernetes API server cannot be reached (names the server)
    +-- ApiError                   the API server answered with a failure Status (.code,
        |                          .status_reason, .message, .details)
        +-- ApiNotFound            404 NotFound
        +-- ApiAlreadyExists       409 AlreadyExists
        +-- ApiConflict            409 Conflict: stale resourceVersion, apply field conflicts
        +-- ApiGone                410 Gone/Expired: watch or continue token too old: relist
        +-- ApiInvalid             422 Invalid (.causes)
        +-- ApiUnauthorized        401
        +-- ApiForbidden           403
```

The Kubernetes errors are raised only by `corepin.kube` (mapped there in one place from HTTP
answers and socket/TLS failures); their `reason` is `api_<snake case of the Status reason>`,
the Status reason itself is `status_reason`.

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


class KubeConfigError(EnvironmentProblem):
    """No usable API server configuration: names the file (or setting) and what is wrong."""

    default_reason = "kubeconfig"

    def __init__(self, source: str, problem: str) -> None:
        self.source = source
        self.problem = problem
        super().__init__(f"{source}: {problem}")


class ApiUnreachable(EnvironmentProblem):
    """The Kubernetes API server could not be reached (connect, TLS or transport failure)."""

    default_reason = "api_unreachable"

    def __init__(self, server: str, problem: str) -> None:
        self.server = server
        self.problem = problem
        super().__init__(f"Kubernetes API server {server} unreachable: {problem}")


def _snake(text: str) -> str:
    out = []
    for i, ch in enumerate(text):
        if ch.isupper() and i and not text[i - 1].isupper():
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


class ApiError(EnvironmentProblem):
    """The API server refused a request: HTTP `code`, the Status `status_reason` and message."""

    default_reason = "api_error"

    def __init__(
        self,
        code: int,
        status_reason: str,
        message: str,
        *,
        details: dict[str, object] | None = None,
        verb: str = "",
        target: str = "",
    ) -> None:
        self.code = code
        self.status_reason = status_reason
        self.api_message = message
        self.details = details or {}
        self.verb = verb
        self.target = target
        # seconds the server asked us to wait before trying again (Retry-After), when it did
        self.retry_after: float | None = None
        where = f"{verb} {target}: " if verb or target else ""
        reason = "api_" + _snake(status_reason) if status_reason else self.default_reason
        super().__init__(f"{where}{message} ({code} {status_reason})".strip(), reason=reason)

    @property
    def retryable(self) -> bool:
        """Worth retrying as is: throttling, timeouts and server-side failures."""
        return self.code in (429, 500, 502, 503, 504)

    @property
    def causes(self) -> list[dict[str, object]]:
        found = self.details.get("causes")
        return [c for c in found if isinstance(c, dict)] if isinstance(found, list) else []


class ApiNotFound(ApiError):
    """404: the object (or the resource type) does not exist."""


class ApiAlreadyExists(ApiError):
    """409 AlreadyExists: create of a name that is taken."""


class ApiConflict(ApiError):
    """409 Conflict: the object changed since it was read (stale resourceVersion), or an
    apply touched fields another manager owns."""


class ApiGone(ApiError):
    """410: the resource version (watch) or continue token is too old; list again."""


class ApiInvalid(ApiError):
    """422: the object failed validation; `causes` names the fields."""


class ApiUnauthorized(ApiError):
    """401: the credentials were not accepted."""


class ApiForbidden(ApiError):
    """403: authenticated, but not allowed (RBAC)."""
