"""Where the API server is and how to authenticate: `--kubeconfig FILE`, else `$KUBECONFIG`
(a path list, merged with the first file winning, as kubectl does), else the in-cluster service
account. The environment and the service-account root are parameters (only the composition
root reads the real ones).

Supported: http and https servers; `token`, `tokenFile` (re-read, so rotated tokens work),
`client-certificate`/`client-key` as files or `-data`, `certificate-authority` as a file or
`-data`, `insecure-skip-tls-verify`, `tls-server-name`, `current-context` or a given context,
the context's namespace. Not supported (a clear KubeConfigError): `exec` and `auth-provider`
credential plugins, username/password.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from corepin.core.errors import KubeConfigError

#: Where a pod finds its service account credentials.
SERVICE_ACCOUNT_ROOT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class ClusterConfig:
    """Everything needed to talk to one API server."""

    server: str
    source: str  # what this came from, for error messages: a file, or "in-cluster"
    token: str | None = None
    token_file: Path | None = None
    ca_file: Path | None = None
    ca_data: bytes | None = None
    client_cert_file: Path | None = None
    client_cert_data: bytes | None = None
    client_key_file: Path | None = None
    client_key_data: bytes | None = None
    insecure_skip_tls_verify: bool = False
    tls_server_name: str | None = None
    namespace: str = "default"
    context: str = ""

    @property
    def https(self) -> bool:
        return self.server.lower().startswith("https://")

    def bearer_token(self) -> str | None:
        """The token to send now (a token file is read each time it is asked for)."""
        if self.token_file is not None:
            try:
                return self.token_file.read_text().strip() or None
            except OSError as exc:
                raise KubeConfigError(
                    str(self.token_file), f"cannot read token file: {exc.strerror}"
                ) from exc
        return self.token


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise KubeConfigError(str(path), f"cannot read kubeconfig: {exc.strerror}") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise KubeConfigError(str(path), f"not valid YAML: {exc}") from exc
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise KubeConfigError(str(path), "not a kubeconfig (expected a mapping)")
    return doc


def _named(
    doc: Mapping[str, Any], section: str, source: str
) -> dict[str, tuple[dict[str, Any], Path]]:
    out: dict[str, tuple[dict[str, Any], Path]] = {}
    entries = doc.get(section) or []
    if not isinstance(entries, list):
        raise KubeConfigError(source, f"'{section}' must be a list")
    key = section[:-1]
    for entry in entries:
        if not isinstance(entry, dict) or "name" not in entry:
            raise KubeConfigError(source, f"an entry of '{section}' has no name")
        body = entry.get(key) or {}
        if not isinstance(body, dict):
            raise KubeConfigError(source, f"{key} {entry['name']!r} must be a mapping")
        out[str(entry["name"])] = (body, Path(source).parent)
    return out


def _decode(value: object, what: str, source: str) -> bytes:
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise KubeConfigError(source, f"{what} is not valid base64") from exc


def _path(value: object, base: Path) -> Path:
    path = Path(os.path.expanduser(str(value)))
    return path if path.is_absolute() else base / path


def load_kubeconfig(paths: list[Path], *, context: str | None = None) -> ClusterConfig:
    """The configuration a kubeconfig (or several, merged first-wins) selects."""
    source = str(paths[0])
    clusters: dict[str, tuple[dict[str, Any], Path]] = {}
    users: dict[str, tuple[dict[str, Any], Path]] = {}
    contexts: dict[str, tuple[dict[str, Any], Path]] = {}
    current = ""
    for path in paths:
        if not path.exists() and len(paths) > 1:
            continue
        doc = _load_yaml(path)
        for target, section in ((clusters, "clusters"), (users, "users"), (contexts, "contexts")):
            for name, value in _named(doc, section, str(path)).items():
                target.setdefault(name, value)
        current = current or str(doc.get("current-context") or "")
    chosen = context or current
    if not chosen:
        raise KubeConfigError(source, "no current-context is set and no context was given")
    if chosen not in contexts:
        raise KubeConfigError(source, f"context {chosen!r} is not defined")
    ctx, _ = contexts[chosen]
    cluster_name = str(ctx.get("cluster") or "")
    if cluster_name not in clusters:
        raise KubeConfigError(
            source, f"context {chosen!r} names cluster {cluster_name!r}, which is not defined"
        )
    cluster, cluster_base = clusters[cluster_name]
    user_name = str(ctx.get("user") or "")
    user, user_base = users.get(user_name, ({}, Path(source).parent))
    if user_name and user_name not in users:
        raise KubeConfigError(
            source, f"context {chosen!r} names user {user_name!r}, which is not defined"
        )
    server = str(cluster.get("server") or "")
    if not server.startswith(("http://", "https://")):
        raise KubeConfigError(
            source, f"cluster {cluster_name!r} has no http(s) server (server: {server!r})"
        )
    for unsupported in ("exec", "auth-provider", "username", "password"):
        if unsupported in user:
            raise KubeConfigError(
                source,
                f"user {user_name!r} uses {unsupported!r}, which "
                "corepin does not support: use a token, a token "
                "file or a client certificate",
            )
    return ClusterConfig(
        server=server.rstrip("/"),
        source=source,
        token=str(user["token"]) if user.get("token") else None,
        token_file=_path(user["tokenFile"], user_base) if user.get("tokenFile") else None,
        ca_file=(
            _path(cluster["certificate-authority"], cluster_base)
            if cluster.get("certificate-authority")
            else None
        ),
        ca_data=(
            _decode(cluster["certificate-authority-data"], "certificate-authority-data", source)
            if cluster.get("certificate-authority-data")
            else None
        ),
        client_cert_file=(
            _path(user["client-certificate"], user_base) if user.get("client-certificate") else None
        ),
        client_cert_data=(
            _decode(user["client-certificate-data"], "client-certificate-data", source)
            if user.get("client-certificate-data")
            else None
        ),
        client_key_file=(_path(user["client-key"], user_base) if user.get("client-key") else None),
        client_key_data=(
            _decode(user["client-key-data"], "client-key-data", source)
            if user.get("client-key-data")
            else None
        ),
        insecure_skip_tls_verify=bool(cluster.get("insecure-skip-tls-verify")),
        tls_server_name=str(cluster["tls-server-name"]) if cluster.get("tls-server-name") else None,
        namespace=str(ctx.get("namespace") or "default"),
        context=chosen,
    )


def in_cluster_config(env: Mapping[str, str], root: Path = SERVICE_ACCOUNT_ROOT) -> ClusterConfig:
    """The pod's own service account: KUBERNETES_SERVICE_HOST/PORT and the files under `root`."""
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "")
    token = root / "token"
    if not host or not port:
        raise KubeConfigError(
            "in-cluster",
            "no --kubeconfig, no $KUBECONFIG, and not in a pod "
            "(KUBERNETES_SERVICE_HOST/PORT unset)",
        )
    if not token.is_file():
        raise KubeConfigError(str(token), "service account token missing")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    ca = root / "ca.crt"
    namespace_file = root / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.is_file() else "default"
    return ClusterConfig(
        server=f"https://{host}:{port}",
        source="in-cluster",
        token_file=token,
        ca_file=ca if ca.is_file() else None,
        namespace=namespace or "default",
        context="in-cluster",
    )


def load_config(
    kubeconfig: str | Path | None = None,
    *,
    env: Mapping[str, str],
    service_account_root: Path = SERVICE_ACCOUNT_ROOT,
    context: str | None = None,
) -> ClusterConfig:
    """`kubeconfig` if given, else `$KUBECONFIG` from `env`, else the in-cluster account."""
    if kubeconfig:
        path = Path(kubeconfig)
        if not path.exists():
            raise KubeConfigError(str(path), "no such kubeconfig file")
        return load_kubeconfig([path], context=context)
    listed = [Path(p) for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        existing = [p for p in listed if p.exists()]
        if not existing:
            raise KubeConfigError(str(listed[0]), "no such kubeconfig file (from $KUBECONFIG)")
        return load_kubeconfig(existing, context=context)
    return in_cluster_config(env, service_account_root)
