"""PodDisruptionBudgets and the Eviction API, as the API server and the disruption controller
have them.

Two halves:

- the disruption controller (kube-controller-manager), which keeps every PDB's status current:
  `sync_namespace` runs after each write of a pod or a PDB of a namespace (so at once, where the
  real controller follows within moments) and writes a PDB's status only when it changed, as a
  new revision a watch sees. Status: `expectedPods`, `currentHealthy` (ready pods it selects that
  are not being deleted and not recorded in `disruptedPods`), `desiredHealthy` (from
  `minAvailable`, an integer or a percent rounded up, or `expectedPods - maxUnavailable`),
  `disruptionsAllowed` (`currentHealthy - desiredHealthy`, 0 when negative or when the PDB
  selects no pod), `observedGeneration`, the `DisruptionAllowed` condition. One deviation: the
  fake serves no workload controllers, so where the real controller takes `expectedPods` of a
  percent or `maxUnavailable` budget from the pods' controllers' scale, the fake counts the pods
  the PDB selects (the real one refuses every eviction of a bare pod under such a budget).
- the `pods/eviction` subresource (`evict`), step for step as the API server's eviction REST
  handler: a terminal or pending pod (or one being deleted) is deleted without looking at
  budgets; more than one PDB selecting the pod is a 500; a budget whose status is older than its
  spec is a 429 ("still being processed"); `disruptionsAllowed` 0 is a 429 with the cause
  `DisruptionBudget` ("The disruption budget NAME needs N healthy pods and has M currently");
  otherwise the budget records the disruption (`disruptedPods`, `disruptionsAllowed - 1`) and
  the pod is deleted with the eviction's `deleteOptions` (preconditions and grace period
  honoured: a wrong `uid` is a 409 after the budget was charged, as on the real server). An
  unready pod is evicted without charging the budget when the budget is met anyway (or its
  `unhealthyPodEvictionPolicy` is `AlwaysAllow`). `dryRun` changes nothing.
"""

from __future__ import annotations

import copy
import datetime as dt
import math
import re
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

from corepin.testing.fakeapi import errors as err
from corepin.testing.fakeapi.resources import ResourceType
from corepin.testing.fakeapi.schema import FieldError
from corepin.testing.fakeapi.selectors import label_selector_from_object

Obj = dict[str, Any]

PODS = ("", "pods")
PDBS = ("policy", "poddisruptionbudgets")
EVICTION_VERSIONS = ("policy/v1", "policy/v1beta1")
# how long a recorded disruption keeps its pod out of currentHealthy (the controller's
# DeletionTimeout) and the most the eviction handler lets pile up
DELETION_TIMEOUT = dt.timedelta(minutes=2)
MAX_DISRUPTED_PODS = 2000
_PERCENT = re.compile(r"^[0-9]+%$")
_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"

MORE_THAN_ONE = (
    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not "
    "support."
)
VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _parse_time(text: Any) -> dt.datetime | None:
    try:
        return dt.datetime.strptime(str(text), _TIME_FORMAT).replace(tzinfo=dt.UTC)
    except ValueError:
        return None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found = obj.get("metadata")
    return found if isinstance(found, Mapping) else {}


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """The pod's Ready condition is True (what the disruption controller calls healthy)."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


class Cluster(Protocol):
    """What the controller and the eviction handler use of the fake's cluster (a `Cluster`
    of `cluster.py` is one; typed here so that this module need not import it)."""

    @property
    def lock(self) -> AbstractContextManager[Any]: ...

    @property
    def objects(self) -> dict[tuple[str, str], dict[tuple[str, str], Obj]]: ...

    def resource(self, group: str, version: str, plural: str) -> ResourceType: ...

    def commit(
        self, rt: ResourceType, namespace: str, name: str, kind: str, obj: Obj, old: Obj | None
    ) -> Obj: ...

    def delete(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        options: Obj | None = None,
        dry_run: bool = False,
    ) -> tuple[Obj, bool]: ...


# ---------------------------------------------------------------------- validation
def _int_or_percent_problems(path: str, value: Any) -> list[FieldError]:
    if value is None:
        return []
    if isinstance(value, bool) or not isinstance(value, int | str):
        return [FieldError(path, "FieldValueInvalid", f"Invalid value: {value!r}: must be int")]
    if isinstance(value, int):
        if value < 0:
            return [
                FieldError(
                    path,
                    "FieldValueInvalid",
                    f"Invalid value: {value}: must be greater than or equal to 0",
                )
            ]
        return []
    if not _PERCENT.match(value):
        return [
            FieldError(
                path,
                "FieldValueInvalid",
                f'Invalid value: "{value}": a valid percent string must be a numeric string '
                "followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is "
                "'[0-9]+%')",
            )
        ]
    if int(value[:-1]) > 100:
        return [
            FieldError(
                path,
                "FieldValueInvalid",
                f'Invalid value: "{value}": must not be greater than 100%',
            )
        ]
    return []


def pdb_problems(pdb: Mapping[str, Any]) -> list[FieldError]:
    """What the API server's validation refuses in a PodDisruptionBudget's spec."""
    spec = pdb.get("spec") or {}
    problems: list[FieldError] = []
    if spec.get("minAvailable") is not None and spec.get("maxUnavailable") is not None:
        problems.append(
            FieldError(
                "spec",
                "FieldValueInvalid",
                "Invalid value: minAvailable and maxUnavailable cannot be both set",
            )
        )
    for key in ("minAvailable", "maxUnavailable"):
        problems.extend(_int_or_percent_problems(f"spec.{key}", spec.get(key)))
    policy = spec.get("unhealthyPodEvictionPolicy")
    if policy is not None and policy not in ("IfHealthyBudget", "AlwaysAllow"):
        problems.append(
            FieldError(
                "spec.unhealthyPodEvictionPolicy",
                "FieldValueNotSupported",
                f'Unsupported value: "{policy}": supported values: "AlwaysAllow", '
                '"IfHealthyBudget"',
            )
        )
    return problems


# ---------------------------------------------------------------------- the controller
def _scaled(value: Any, total: int) -> int:
    """An int-or-percent of `total`, a percent rounded up."""
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * total / 100)
    return int(value)


def controller_selects(pdb: Mapping[str, Any], labels: Mapping[str, str] | None) -> bool:
    """The pods the controller counts: a missing selector selects none, an empty one all."""
    selector = (pdb.get("spec") or {}).get("selector")
    if not isinstance(selector, Mapping):
        return False
    try:
        return label_selector_from_object(selector).matches(labels)
    except (KeyError, TypeError):
        return False


def eviction_selects(pdb: Mapping[str, Any], labels: Mapping[str, str] | None) -> bool:
    """The PDBs the eviction handler applies to a pod: a missing, empty or invalid selector
    matches nothing there."""
    selector = (pdb.get("spec") or {}).get("selector")
    if not isinstance(selector, Mapping):
        return False
    try:
        parsed = label_selector_from_object(selector)
    except (KeyError, TypeError):
        return False
    return bool(parsed.requirements) and parsed.matches(labels)


def pdb_status(pdb: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], now: dt.datetime) -> Obj:
    """The status the disruption controller computes for `pdb` over the namespace's `pods`."""
    spec = pdb.get("spec") or {}
    old = pdb.get("status") or {}
    selected = [p for p in pods if controller_selects(pdb, _meta(p).get("labels"))]
    expected = len(selected)
    if spec.get("maxUnavailable") is not None:
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected))
    elif isinstance(spec.get("minAvailable"), str):
        desired = _scaled(spec["minAvailable"], expected)
    elif spec.get("minAvailable") is not None:
        desired = int(spec["minAvailable"])
    else:
        desired, expected = 0, 0
    recorded = old.get("disruptedPods") or {}
    disrupted: Obj = {}
    for pod in selected:
        name = str(_meta(pod).get("name", ""))
        when = _parse_time(recorded.get(name)) if name in recorded else None
        if _meta(pod).get("deletionTimestamp") or when is None:
            continue
        if when + DELETION_TIMEOUT > now:
            disrupted[name] = recorded[name]
    healthy = sum(
        1
        for pod in selected
        if not _meta(pod).get("deletionTimestamp")
        and str(_meta(pod).get("name", "")) not in disrupted
        and pod_ready(pod)
    )
    allowed = healthy - desired
    if expected <= 0 or allowed <= 0:
        allowed = 0
    generation = int(_meta(pdb).get("generation") or 1)
    status: Obj = {
        "observedGeneration": generation,
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": _allowed_condition(old.get("conditions") or [], allowed > 0, generation, now),
    }
    if disrupted:
        status["disruptedPods"] = disrupted
    return status


def _allowed_condition(
    conditions: Iterable[Any], allowed: bool, generation: int, now: dt.datetime
) -> list[Obj]:
    """The conditions with `DisruptionAllowed` set (its transition time kept while its status
    stays)."""
    wanted = "True" if allowed else "False"
    out: list[Obj] = []
    since = now.strftime(_TIME_FORMAT)
    for cond in conditions:
        if not isinstance(cond, Mapping):
            continue
        if cond.get("type") != "DisruptionAllowed":
            out.append(dict(cond))
        elif cond.get("status") == wanted and cond.get("lastTransitionTime"):
            since = str(cond["lastTransitionTime"])
    out.append(
        {
            "type": "DisruptionAllowed",
            "status": wanted,
            "reason": "SufficientPods" if allowed else "InsufficientPods",
            "message": "",
            "observedGeneration": generation,
            "lastTransitionTime": since,
        }
    )
    return out


def sync_namespace(cluster: Cluster, namespace: str) -> None:
    """Bring the status of every PDB of `namespace` up to date (the caller holds the lock)."""
    budgets = cluster.objects.get(PDBS) or {}
    keys = sorted(k for k in budgets if k[0] == namespace)
    if not keys:
        return
    pods = [p for k, p in (cluster.objects.get(PODS) or {}).items() if k[0] == namespace]
    rt = cluster.resource("policy", "v1", "poddisruptionbudgets")
    now = _now()
    for key in keys:
        current = budgets.get(key)
        if current is None:
            continue
        status = pdb_status(current, pods, now)
        if status == current.get("status"):
            continue
        new = copy.deepcopy(current)
        new["status"] = status
        cluster.commit(rt, namespace, key[1], "MODIFIED", new, current)


# ---------------------------------------------------------------------- pods/eviction
def _dry_run(body_options: Mapping[str, Any], query_dry_run: list[str]) -> bool:
    given = body_options.get("dryRun") or []
    if not isinstance(given, list):
        raise err.bad_request("deleteOptions.dryRun must be a list")
    if given and query_dry_run and given != query_dry_run:
        raise err.bad_request(
            "Non-matching dry-run options in request and content: "
            f"[{' '.join(query_dry_run)}] and [{' '.join(str(v) for v in given)}]"
        )
    chosen = given or query_dry_run
    for value in chosen:
        if value != "All":
            raise err.bad_request(f'Invalid dry run value "{value}", must be one of: All')
    return bool(chosen)


def _too_many_requests(message: str, cause: str | None, retry_after: int = 0) -> err.ApiFailure:
    details: Obj = {}
    if retry_after:
        details["retryAfterSeconds"] = retry_after
    if cause is not None:
        details["causes"] = [{"reason": "DisruptionBudget", "message": cause}]
    return err.ApiFailure(429, "TooManyRequests", message, details)


def _forbidden(name: str, why: str) -> err.ApiFailure:
    return err.ApiFailure(
        403,
        "Forbidden",
        f'poddisruptionbudget.policy "{name}" is forbidden: {why}',
        {"name": name, "group": "policy", "kind": "poddisruptionbudget"},
    )


def _can_ignore_budgets(pod: Mapping[str, Any]) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return phase in ("Succeeded", "Failed", "Pending") or bool(_meta(pod).get("deletionTimestamp"))


def _check_and_charge(
    cluster: Cluster, namespace: str, pod_name: str, pdb: Obj, dry_run: bool
) -> None:
    """The budget allows one more disruption: record it (unless dry run); else the refusal."""
    name = str(_meta(pdb).get("name", ""))
    status = pdb.get("status") or {}
    if int(status.get("observedGeneration") or 0) < int(_meta(pdb).get("generation") or 0):
        raise _too_many_requests(
            VIOLATION, f"The disruption budget {name} is still being processed by the server.", 10
        )
    allowed = int(status.get("disruptionsAllowed") or 0)
    if allowed < 0:
        raise _forbidden(name, "pdb disruptions allowed is negative")
    if len(status.get("disruptedPods") or {}) > MAX_DISRUPTED_PODS:
        raise _forbidden(
            name, "DisruptedPods map too big - too many evictions not confirmed by PDB controller"
        )
    if allowed == 0:
        raise _too_many_requests(
            VIOLATION,
            f"The disruption budget {name} needs {int(status.get('desiredHealthy') or 0)} "
            f"healthy pods and has {int(status.get('currentHealthy') or 0)} currently",
        )
    if dry_run:
        return
    new = copy.deepcopy(pdb)
    new_status = new.setdefault("status", {})
    new_status["disruptionsAllowed"] = allowed - 1
    now = _now()
    if allowed - 1 == 0:
        new_status["conditions"] = _allowed_condition(
            new_status.get("conditions") or [],
            False,
            int(new_status.get("observedGeneration") or 0),
            now,
        )
    new_status.setdefault("disruptedPods", {})[pod_name] = now.strftime(_TIME_FORMAT)
    rt = cluster.resource("policy", "v1", "poddisruptionbudgets")
    cluster.commit(rt, namespace, name, "MODIFIED", new, pdb)


def evict(cluster: Cluster, namespace: str, name: str, body: Obj, query_dry_run: list[str]) -> Obj:
    """POST pods/NAME/eviction: the Status the API server answers (201), or its refusal."""
    api_version = body.get("apiVersion") or "policy/v1"
    kind = body.get("kind") or "Eviction"
    if api_version not in EVICTION_VERSIONS:
        raise err.bad_request(
            f"the API version in the data ({api_version}) does not match the expected API "
            "version (policy/v1)"
        )
    if kind != "Eviction":
        raise err.bad_request(f"not a Eviction object: {kind}")
    meta = _meta(body)
    if meta.get("namespace") not in (None, "", namespace):
        raise err.bad_request(
            "the namespace of the provided object does not match the namespace sent on the request"
        )
    if meta.get("name", "") != name:
        raise err.bad_request("name in URL does not match name in Eviction object")
    options = body.get("deleteOptions") or {}
    if not isinstance(options, dict):
        raise err.bad_request("deleteOptions must be an object")
    dry_run = _dry_run(options, query_dry_run)
    pods_rt = cluster.resource("", "v1", "pods")
    with cluster.lock:
        pod = (cluster.objects.get(PODS) or {}).get((namespace, name))
        if pod is None:
            raise err.not_found(pods_rt, name)
        if not _can_ignore_budgets(pod):
            labels = _meta(pod).get("labels")
            budgets = [
                b
                for k, b in sorted((cluster.objects.get(PDBS) or {}).items())
                if k[0] == namespace and eviction_selects(b, labels)
            ]
            if len(budgets) > 1:
                raise err.ApiFailure(500, "", MORE_THAN_ONE)
            if budgets:
                pdb = budgets[0]
                status = pdb.get("status") or {}
                spec = pdb.get("spec") or {}
                unready_free = not pod_ready(pod) and (
                    spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow"
                    or (
                        int(status.get("currentHealthy") or 0)
                        >= int(status.get("desiredHealthy") or 0)
                        and int(status.get("desiredHealthy") or 0) > 0
                    )
                )
                if not unready_free:
                    _check_and_charge(cluster, namespace, name, pdb, dry_run)
        cluster.delete(pods_rt, namespace, name, options, dry_run)
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
