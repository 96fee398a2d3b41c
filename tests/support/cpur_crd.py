"""The CPUReservation CRD for tests: as `deploy/crd/cpureservations.yaml` ships it when that file
exists, else a minimal one (cluster scoped, status subresource, fields kept as sent), and a
CPUReservation body builder."""

from __future__ import annotations

import contextlib
from typing import Any

from corepin.core.errors import ApiAlreadyExists
from corepin.kube.client import KubeClient
from corepin.kube.resources import CRDS
from support.crd_schema import crd
from support.paths import DEPLOY


def cpur_crd() -> dict[str, Any]:
    if (DEPLOY / "crd" / "cpureservations.yaml").exists():
        return crd("cpureservations")
    loose = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "cpureservations.corepin.io"},
        "spec": {
            "group": "corepin.io",
            "scope": "Cluster",
            "names": {
                "plural": "cpureservations",
                "singular": "cpureservation",
                "kind": "CPUReservation",
                "listKind": "CPUReservationList",
                "shortNames": ["cpur"],
            },
            "versions": [
                {
                    "name": "v1alpha1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": loose, "status": loose},
                        }
                    },
                }
            ],
        },
    }


def install_cpur_crd(kube: KubeClient) -> None:
    with contextlib.suppress(ApiAlreadyExists):
        kube.create(CRDS, cpur_crd())


def cpur(name: str, *, node: str | None = "node-a", **spec: Any) -> dict[str, Any]:
    """A CPUReservation body: `spec` as given (keys as the wire has them), `nodeName` `node`."""
    body_spec = dict(spec)
    if node is not None:
        body_spec.setdefault("nodeName", node)
    return {
        "apiVersion": "corepin.io/v1alpha1",
        "kind": "CPUReservation",
        "metadata": {"name": name},
        "spec": body_spec,
    }
