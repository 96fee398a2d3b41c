"""A fake Kubernetes API server for tests: real HTTP(S) on 127.0.0.1, the API server's semantics
where corepin and its users depend on them (resource versions, watch from a version and 410
Gone, selectors, status subresource, CRDs with schema validation and pruning, patches,
server-side apply basics, finalizers, `pods/eviction` with PodDisruptionBudgets whose status a
built-in disruption controller keeps), plus controls to break it on purpose.

    from corepin.testing.fakeapi import FakeApiServer
    with FakeApiServer() as api:              # or the `fake_api` fixture in conftest.py
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        api.drop_watches(); api.compact(); api.inject("/api/v1/pods", status=500)
        api.recorded(verb="list", resource="pods")

It ships inside the package (not only in tests/) so that `corepin dev cluster`, the one-machine
stand-in cluster, can run it; product code never imports it (an import-linter contract). The
TLS helpers need the `cryptography` package, a development dependency only: `TLSMaterial` and
`make_tls` are imported from `tls` when first asked for, so a plain-http fake runs without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corepin.testing.fakeapi.cluster import Cluster
from corepin.testing.fakeapi.kubeconfig import write_kubeconfig
from corepin.testing.fakeapi.server import FakeApiServer, RequestRecord, running

if TYPE_CHECKING:
    from corepin.testing.fakeapi.tls import TLSMaterial, make_tls

__all__ = [
    "Cluster",
    "FakeApiServer",
    "RequestRecord",
    "TLSMaterial",
    "make_tls",
    "running",
    "write_kubeconfig",
]


def __getattr__(name: str) -> Any:
    """`TLSMaterial` and `make_tls`, imported on first use (they need `cryptography`)."""
    if name in ("TLSMaterial", "make_tls"):
        from corepin.testing.fakeapi import tls

        return getattr(tls, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
