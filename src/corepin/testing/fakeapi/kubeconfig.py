"""Kubeconfig files for a fake API server: token or client-certificate users, the CA as a file or
as `-data`, or `insecure-skip-tls-verify`."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(
    path: Path,
    server: str,
    *,
    token: str | None = None,
    client: tuple[Path, Path] | None = None,
    ca: Path | None = None,
    insecure: bool = False,
    embed: bool = False,
    context: str = "fake",
    namespace: str | None = None,
) -> Path:
    """Write a one-context kubeconfig for `server` and return its path."""
    cluster: dict[str, Any] = {"server": server}
    if ca is not None:
        if embed:
            cluster["certificate-authority-data"] = _b64(ca)
        else:
            cluster["certificate-authority"] = str(ca)
    if insecure:
        cluster["insecure-skip-tls-verify"] = True
    user: dict[str, Any] = {}
    if token is not None:
        user["token"] = token
    if client is not None:
        cert, key = client
        if embed:
            user["client-certificate-data"] = _b64(cert)
            user["client-key-data"] = _b64(key)
        else:
            user["client-certificate"] = str(cert)
            user["client-key"] = str(key)
    ctx: dict[str, Any] = {"cluster": f"{context}-cluster", "user": f"{context}-user"}
    if namespace:
        ctx["namespace"] = namespace
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": f"{context}-cluster", "cluster": cluster}],
        "users": [{"name": f"{context}-user", "user": user}],
        "contexts": [{"name": context, "context": ctx}],
        "current-context": context,
        "preferences": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path
