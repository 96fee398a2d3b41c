"""A fake Kubernetes API server for tests: real HTTP(S) on 127.0.0.1, the API server's semantics
where corepin and its users depend on them (resource versions, watch from a version and 410
Gone, selectors, status subresource, CRDs with schema validation and pruning, patches,
server-side apply basics, finalizers, `pods/eviction` with PodDisruptionBudgets whose status a
built-in disruption controller keeps), plus controls to break it on purpose.

    from fakeapi import FakeApiServer
    with FakeApiServer() as api:              # or the `fake_api` fixture in conftest.py
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        api.drop_watches(); api.compact(); api.inject("/api/v1/pods", status=500)
        api.recorded(verb="list", resource="pods")
"""

from fakeapi.cluster import Cluster
from fakeapi.kubeconfig import write_kubeconfig
from fakeapi.server import FakeApiServer, RequestRecord, running
from fakeapi.tls import TLSMaterial, make_tls

__all__ = [
    "Cluster",
    "FakeApiServer",
    "RequestRecord",
    "TLSMaterial",
    "make_tls",
    "running",
    "write_kubeconfig",
]
