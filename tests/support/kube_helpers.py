"""Objects and small helpers shared by the Kubernetes tests."""

from __future__ import annotations

import contextlib
from typing import Any

from corepin.core.errors import ApiAlreadyExists
from corepin.kube.client import KubeClient, Resource
from corepin.kube.resources import CRDS
from support.crd_schema import crd

Obj = dict[str, Any]

WIDGETS = Resource("example.com", "v1", "widgets", True, "Widget")
GADGETS = Resource("example.com", "v1", "gadgets", False, "Gadget")


def install_crds(kube: KubeClient, *plurals: str) -> None:
    """Create corepin's CRDs as `deploy/crd` ships them (`plurals`: only these; default: all);
    one the API server has already is left as it is."""
    for plural in plurals or ("nodecputopologies", "podcpubindings", "cpureservations"):
        with contextlib.suppress(ApiAlreadyExists):
            kube.create(CRDS, crd(plural))


def widget_crd(*, scope: str = "Namespaced", status: bool = True) -> Obj:
    """A CRD exercising the schema features the fake enforces."""
    plural, kind = ("widgets", "Widget") if scope == "Namespaced" else ("gadgets", "Gadget")
    version: Obj = {
        "name": "v1",
        "served": True,
        "storage": True,
        "additionalPrinterColumns": [{"name": "Size", "type": "integer", "jsonPath": ".spec.size"}],
        "schema": {
            "openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {
                        "type": "object",
                        "required": ["size"],
                        "properties": {
                            "size": {"type": "integer", "minimum": 1, "maximum": 10},
                            "color": {"type": "string", "enum": ["red", "blue"], "default": "red"},
                            "code": {"type": "string", "pattern": "^[a-z]{3}$"},
                            "cpus": {
                                "type": "array",
                                "x-kubernetes-list-type": "set",
                                "items": {"type": "integer"},
                            },
                            "parts": {
                                "type": "array",
                                "x-kubernetes-list-type": "map",
                                "x-kubernetes-list-map-keys": ["name"],
                                "items": {
                                    "type": "object",
                                    "required": ["name"],
                                    "properties": {
                                        "name": {"type": "string"},
                                        "count": {"type": "integer"},
                                    },
                                },
                            },
                            "options": {
                                "type": "object",
                                "additionalProperties": {"type": "string"},
                            },
                            "free": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                        },
                    },
                    "status": {
                        "type": "object",
                        "properties": {"ready": {"type": "boolean"}, "message": {"type": "string"}},
                    },
                },
            }
        },
    }
    if status:
        version["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.example.com"},
        "spec": {
            "group": "example.com",
            "scope": scope,
            "names": {
                "plural": plural,
                "singular": kind.lower(),
                "kind": kind,
                "shortNames": ["wg" if scope == "Namespaced" else "gg"],
            },
            "versions": [version],
        },
    }


def widget(name: str, size: int = 3, namespace: str = "default", **spec: Any) -> Obj:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"size": size, **spec},
    }
