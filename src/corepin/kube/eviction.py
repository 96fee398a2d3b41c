"""Evicting a pod through the Eviction API (`POST pods/NAME/eviction`), which honours the
PodDisruptionBudgets that select it: the API server deletes the pod only when its budget
allows one more disruption, and otherwise answers 429 with the budget's reason.

`evict` makes one attempt and says what came of it; it never retries (the caller tries again
later, e.g. on its next pass, and reports the refusal meanwhile). A pod that is already gone
counts as evicted, and so does one replaced by a new pod of the same name when `uid` names the
old one: the uid precondition keeps the new pod from being evicted by mistake.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corepin.core.errors import ApiConflict, ApiError, ApiNotFound, InputError
from corepin.kube.client import KubeClient
from corepin.kube.resources import PODS

Obj = dict[str, Any]

EVICTION_API_VERSION = "policy/v1"
#: the cause the API server gives when a PodDisruptionBudget refuses an eviction
DISRUPTION_BUDGET_CAUSE = "DisruptionBudget"


@dataclass(frozen=True)
class EvictionResult:
    """What came of one eviction request.

    `evicted`: the API server accepted it (the pod is deleted or being deleted) or the pod was
    gone already (`gone`). Otherwise it was refused: `code` and `reason` are the API's (429
    `TooManyRequests` when a PodDisruptionBudget forbids it now), `message` its message with
    the causes it gave (the budget's "needs N healthy pods and has M currently"), `retry_after`
    the seconds it asked to wait, when it did.
    """

    namespace: str
    name: str
    evicted: bool
    gone: bool = False
    code: int = 0
    reason: str = ""
    message: str = ""
    causes: tuple[str, ...] = ()
    retry_after: float | None = None
    disruption_budget: bool = False

    @property
    def refused(self) -> bool:
        return not self.evicted

    @property
    def retryable(self) -> bool:
        """A refusal that may well pass later (a budget, throttling, a server-side failure)."""
        return self.refused and self.code in (429, 500, 502, 503, 504)

    def describe(self) -> str:
        """One line for logs and Events."""
        who = f"pod {self.namespace}/{self.name}"
        if self.gone:
            return f"{who} was already gone"
        if self.evicted:
            return f"{who} evicted"
        return f"eviction of {who} refused ({self.code} {self.reason}): {self.message}"


def eviction_body(
    namespace: str,
    name: str,
    *,
    uid: str | None = None,
    grace_seconds: int | None = None,
) -> Obj:
    """The `policy/v1` Eviction object for one pod."""
    body: Obj = {
        "apiVersion": EVICTION_API_VERSION,
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    }
    options: Obj = {}
    if uid:
        options["preconditions"] = {"uid": uid}
    if grace_seconds is not None:
        if grace_seconds < 0:
            raise InputError(f"grace_seconds must be 0 or more, got {grace_seconds}")
        options["gracePeriodSeconds"] = grace_seconds
    if options:
        body["deleteOptions"] = {"kind": "DeleteOptions", "apiVersion": "v1", **options}
    return body


def _pod_not_found(exc: ApiNotFound, name: str) -> bool:
    """The 404 names the pod (or its namespace), not a resource the server does not serve."""
    kind = exc.details.get("kind")
    return (kind == "pods" and exc.details.get("name") == name) or kind == "namespaces"


def _uid_mismatch(exc: ApiConflict) -> bool:
    return "UID in precondition" in exc.api_message


def _refusal(namespace: str, name: str, exc: ApiError) -> EvictionResult:
    causes = tuple(str(c.get("message")) for c in exc.causes if c.get("message"))
    message = exc.api_message
    if causes:
        message = f"{message} ({'; '.join(causes)})"
    return EvictionResult(
        namespace,
        name,
        evicted=False,
        code=exc.code,
        reason=exc.status_reason,
        message=message,
        causes=causes,
        retry_after=exc.retry_after,
        disruption_budget=any(c.get("reason") == DISRUPTION_BUDGET_CAUSE for c in exc.causes),
    )


def evict(
    client: KubeClient,
    namespace: str,
    name: str,
    *,
    uid: str | None = None,
    grace_seconds: int | None = None,
    dry_run: bool = False,
) -> EvictionResult:
    """Ask the API server to evict one pod, once. `uid` (recommended) makes the request apply
    to that pod only; `grace_seconds` overrides its termination grace period. Refusals come back
    as a result, never raised; only a server that cannot be reached raises (ApiUnreachable)."""
    body = eviction_body(namespace, name, uid=uid, grace_seconds=grace_seconds)
    try:
        client.create_subresource(PODS, name, "eviction", body, namespace, dry_run=dry_run)
    except ApiNotFound as exc:
        if _pod_not_found(exc, name):
            return EvictionResult(namespace, name, evicted=True, gone=True)
        return _refusal(namespace, name, exc)
    except ApiConflict as exc:
        if uid and _uid_mismatch(exc):
            return EvictionResult(namespace, name, evicted=True, gone=True)
        return _refusal(namespace, name, exc)
    except ApiError as exc:
        return _refusal(namespace, name, exc)
    return EvictionResult(namespace, name, evicted=True)
