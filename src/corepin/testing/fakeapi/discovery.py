"""Discovery in the fake API server: the version, the API groups and versions, the resource
lists (with subresources), and a minimal OpenAPI v3 index and documents, all from the resource
types the cluster serves at the time of the request.
"""

from __future__ import annotations

import hashlib
import json
import re

from corepin.testing.fakeapi import errors as err
from corepin.testing.fakeapi.cluster import Cluster
from corepin.testing.fakeapi.store import Obj

VERSION_INFO = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-fake",
    "gitCommit": "fake",
    "gitTreeState": "clean",
    "buildDate": "2024-12-11T00:00:00Z",
    "goVersion": "go1.23.3",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def api_versions(port: int) -> Obj:
    """/api: the core group's versions."""
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{port}"}
        ],
    }


def _version_key(version: str) -> tuple[int, int, int, str]:
    match = re.match(r"^v(\d+)(?:(alpha|beta)(\d+))?$", version)
    if not match:
        return (3, 0, 0, version)
    stage = {"alpha": 2, "beta": 1, None: 0}[match.group(2)]
    return (stage, -int(match.group(1)), -int(match.group(3) or 0), version)


def group_entry(group: str, versions: list[str]) -> Obj:
    ordered = sorted(versions, key=_version_key)
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in ordered]
    return {"name": group, "versions": entries, "preferredVersion": entries[0]}


def group_list(cluster: Cluster) -> Obj:
    """/apis: the groups, in the order they were first served."""
    served = cluster.group_versions()
    groups = [group_entry(g, served[g]) for g in cluster.group_order if g in served]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(cluster: Cluster, group: str) -> Obj:
    """/apis/GROUP."""
    served = cluster.group_versions()
    if group not in served:
        raise err.ApiFailure(
            404, "NotFound", "the server could not find the requested resource", {}
        )
    return {"kind": "APIGroup", "apiVersion": "v1", **group_entry(group, served[group])}


def resource_list(cluster: Cluster, group: str, version: str) -> Obj:
    """/api/v1 or /apis/GROUP/VERSION: the resources served and their subresources."""
    types = cluster.resources_of(group, version)
    if not types:
        raise err.ApiFailure(
            404, "NotFound", "the server could not find the requested resource", {}
        )
    resources: list[Obj] = []
    for rt in types:
        entry: Obj = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": list(rt.verbs),
            "storageVersionHash": hashlib.sha256(f"{rt.group}/{rt.plural}".encode()).hexdigest()[
                :12
            ],
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        resources.append(entry)
        for sub in sorted(rt.subresources):
            if sub == "eviction":
                resources.append(
                    {
                        "name": f"{rt.plural}/eviction",
                        "singularName": "",
                        "namespaced": True,
                        "group": "policy",
                        "version": "v1",
                        "kind": "Eviction",
                        "verbs": ["create"],
                    }
                )
            elif sub == "binding":
                resources.append(
                    {
                        "name": f"{rt.plural}/binding",
                        "singularName": "",
                        "namespaced": True,
                        "kind": "Binding",
                        "verbs": ["create"],
                    }
                )
            elif sub in ("status", "finalize"):
                verbs = ["get", "patch", "update"] if sub == "status" else ["update"]
                resources.append(
                    {
                        "name": f"{rt.plural}/{sub}",
                        "singularName": "",
                        "namespaced": rt.namespaced,
                        "kind": rt.kind,
                        "verbs": verbs,
                    }
                )
    gv = f"{group}/{version}" if group else version
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": resources,
    }


def openapi_doc(cluster: Cluster, group: str, version: str) -> Obj:
    """A minimal OpenAPI v3 document: enough for kubectl to see that PATCH accepts the
    `fieldValidation` parameter (so it validates on the server, as with a real one)."""
    paths: Obj = {}
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    for rt in cluster.resources_of(group, version):
        item = (
            f"{prefix}/namespaces/{{namespace}}/{rt.plural}/{{name}}"
            if rt.namespaced
            else f"{prefix}/{rt.plural}/{{name}}"
        )
        operation = {
            "x-kubernetes-group-version-kind": {
                "group": group,
                "version": version,
                "kind": rt.kind,
            },
            "parameters": [
                {
                    "name": "fieldValidation",
                    "in": "query",
                    "schema": {"type": "string", "uniqueItems": True},
                },
                {
                    "name": "fieldManager",
                    "in": "query",
                    "schema": {"type": "string", "uniqueItems": True},
                },
            ],
            "responses": {"200": {"description": "OK"}},
        }
        paths[item] = {"patch": operation}
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }


def openapi(cluster: Cluster, path: str) -> Obj:
    """/openapi/v3 (the index) or one group-version's document under it."""
    if path == "/openapi/v3":
        paths: Obj = {}
        for group, versions in cluster.group_versions().items():
            for version in versions:
                key = f"apis/{group}/{version}" if group else f"api/{version}"
                digest = hashlib.sha256(
                    json.dumps(openapi_doc(cluster, group, version), sort_keys=True).encode()
                ).hexdigest()
                paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={digest[:32]}"}
        return {"paths": paths}
    match = re.match(r"^/openapi/v3/(?:api/(v\w+)|apis/([^/]+)/([^/]+))$", path)
    if match:
        group = match.group(2) or ""
        version = match.group(1) or match.group(3)
        if cluster.resources_of(group, version):
            return openapi_doc(cluster, group, version)
    raise err.ApiFailure(404, "NotFound", "the server could not find the requested resource", {})
