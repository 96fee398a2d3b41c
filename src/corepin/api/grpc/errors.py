"""corepin errors <-> gRPC status codes (the command's exit codes on both ends).

Server side, `status_for(error)`: InputError (exit 2) -> INVALID_ARGUMENT, or NOT_FOUND for an
unknown allocation id; AllocationError (exit 3) -> RESOURCE_EXHAUSTED when CPUs are short,
FAILED_PRECONDITION when the request cannot be met for another reason (a level or an SMT
alignment that the free CPUs cannot give); EnvironmentProblem (exit 4) -> UNAVAILABLE. The
error's `reason` travels in the trailing metadata key `corepin-reason`.

Client side, `error_from_rpc(error, target)` turns a failed call back into the corepin error
of the same exit code; a call that never reached the agent is an EnvironmentProblem naming it.
"""

from __future__ import annotations

from typing import Final

import grpc

from corepin.core.errors import (
    AllocationError,
    CorepinError,
    EnvironmentProblem,
    InputError,
)

REASON_KEY: Final = "corepin-reason"

#: AllocationError reasons that mean "not enough CPUs right now" (RESOURCE_EXHAUSTED).
SHORT_OF_CPUS: Final = frozenset(
    {
        "not_enough_cpus",
        "not_enough_idle_cores",
        "shared_pool_empty",
        "shared_pool_exhausted",
        "cpus_taken",
        "no_shared_cpus",
    }
)


def status_for(error: CorepinError) -> grpc.StatusCode:
    if isinstance(error, InputError):
        if error.reason == "unknown_id":
            return grpc.StatusCode.NOT_FOUND
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(error, AllocationError):
        if error.reason in SHORT_OF_CPUS:
            return grpc.StatusCode.RESOURCE_EXHAUSTED
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(error, EnvironmentProblem):
        return grpc.StatusCode.UNAVAILABLE
    return grpc.StatusCode.INTERNAL


def error_from_rpc(error: grpc.RpcError, target: str) -> CorepinError:
    """The corepin error for a failed call to the agent at `target`."""
    code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = (error.details() if isinstance(error, grpc.Call) else None) or str(code)
    reason = None
    if isinstance(error, grpc.Call):
        for key, value in error.trailing_metadata() or ():
            if key == REASON_KEY and isinstance(value, str):
                reason = value
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND):
        return InputError(details, reason=reason)
    if code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.FAILED_PRECONDITION):
        return AllocationError(details, reason=reason)
    if code == grpc.StatusCode.UNAVAILABLE and reason is None:
        return EnvironmentProblem(
            f"cannot reach the corepin agent at {target}: {details}", reason="agent_unreachable"
        )
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return EnvironmentProblem(f"agent at {target}: {details}", reason=reason or "agent")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return EnvironmentProblem(
            f"the agent at {target} does not serve this call ({details}): is it a corepin "
            "agent of a matching version?",
            reason="agent_unimplemented",
        )
    return CorepinError(f"agent at {target}: {code.name}: {details}", reason=reason)
