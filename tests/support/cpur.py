"""A CPUReservation body builder for tests (the CRD itself is installed by
`support.kube_helpers.install_crds`, as `deploy/crd` ships it)."""

from __future__ import annotations

from typing import Any


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
