"""Where the API server is and how to authenticate, read by the official Kubernetes Python
client's configuration loaders (`kubernetes.config`): `--kubeconfig FILE`, else `$KUBECONFIG`
(a path list, merged as kubectl merges it), else `$HOME/.kube/config`, else the in-cluster
service account. `--context NAME` picks a context instead of the current one. The environment
and the service-account root are parameters (only the composition root reads the real ones).

What the library gives corepin: contexts and merging, `exec` credential plugins
(client.authentication.k8s.io/v1 and v1beta1, handing out a token or a client certificate;
a token is renewed when its expirationTimestamp is near - the library's margin is five minutes
- and any credential after a 401), `auth-provider` (oidc with refresh, written back to the
kubeconfig as kubectl does; gcp),
`token`/`tokenFile`, client certificates and keys as files or `-data`, CA bundles as a file or
`-data`, `insecure-skip-tls-verify`, `tls-server-name`, `proxy-url`, username/password, and the
service account (token re-read every minute). corepin keeps its own transport, informer and
watch (`corepin.kube.transport`, `client`, `informer`): a `ClusterConfig` hands them the server,
the TLS material and the proxy, and its `credentials` the bearer token or client certificate of
the moment; a 401 makes the transport re-authenticate once (`Credentials.refresh`: the plugin
runs again, the token file is read again) before the request is retried.

Why this library, measured (benchmarks/bench_kubeconfig.py, Python 3.11, best of 5 fresh
interpreters; RSS and modules: an interpreter that has loaded a token kubeconfig with the
candidate, against one with only what the transport imports anyway, 18.5 MiB and 128 modules):

    loader                       import     RSS      modules   missing of the list above
    corepin's own (until now)     +33 ms   +1.8 MiB    +27    exec, auth-provider, proxy-url,
                                                              ~/.kube/config
    kubernetes 37.0.2            +170 ms  +24.9 MiB   +419    nothing
    lightkube 1.0.1              +113 ms  +12.5 MiB   +192    $KUBECONFIG lists, exec v1 and
                                                              expiry, auth-provider,
                                                              proxy-url, tls-server-name
    kr8s 0.20.15                 +182 ms  +25.4 MiB   +352    exec expiry, oidc refresh;
                                                              async only (httpx + anyio)

`kubernetes` is the only one that covers what users' kubeconfigs hold (EKS, GKE and AKS
kubeconfigs are exec plugins with expiring tokens; older ones are oidc auth-providers), and it
is the Kubernetes project's own. lightkube is cheaper but lacks half of it, and its exec support
lives in an httpx auth flow that corepin's transport cannot use; kr8s costs as much as the
official client and does less. The price is paid only by the Kubernetes commands - the
agent, controller, scheduler, extender, webhook, nri and `report --node` load this module;
`corepin run` and the other host-mode commands never do. In the node agent
(benchmarks/bench_agent.py --quick, 50 pods): RSS 53.8 MB before, 74.3 MB after (the budget is
100 MB), the start about 0.17 s longer; pinning latency and idle CPU unchanged, as the requests
go through corepin's own transport either way.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml
from kubernetes.client import Configuration
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.incluster_config import InClusterConfigLoader
from kubernetes.config.kube_config import KubeConfigLoader, KubeConfigMerger

from corepin.core.errors import KubeConfigError

#: Where a pod finds its service account credentials.
SERVICE_ACCOUNT_ROOT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class Credentials(Protocol):
    """Who corepin is to the API server, as of now (thread-safe)."""

    def authorization(self) -> str | None:
        """The Authorization header to send now (`Bearer TOKEN`, or `Basic ...` for a
        username and password), the token refreshed first when it has expired."""

    def client_certificate(self) -> tuple[Path, Path] | None:
        """The client certificate and key files to present now, if any."""

    def refresh(self) -> bool:
        """Authenticate again now (the server refused the credentials): True when that may
        have changed them (a plugin ran again, a file was read again)."""


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
    proxy_url: str | None = None
    namespace: str = "default"
    context: str = ""
    #: where the token and client certificate come from when a library loader made this
    credentials: Credentials | None = field(default=None, compare=False, repr=False)

    @property
    def https(self) -> bool:
        return self.server.lower().startswith("https://")

    def authorization(self) -> str | None:
        """The Authorization header to send now, if any."""
        if self.credentials is not None and self.token_file is None:
            return self.credentials.authorization()
        token = self.bearer_token()
        return f"Bearer {token}" if token else None

    def bearer_token(self) -> str | None:
        """The bearer token to send now (a token file is read each time it is asked for)."""
        if self.credentials is not None and self.token_file is None:
            scheme, _, token = (self.credentials.authorization() or "").partition(" ")
            return token if scheme == "Bearer" and token else None
        if self.token_file is not None:
            try:
                return self.token_file.read_text().strip() or None
            except OSError as exc:
                raise KubeConfigError(
                    str(self.token_file), f"cannot read token file: {exc.strerror}"
                ) from exc
        return self.token

    def client_certificate(self) -> tuple[Path, Path] | None:
        """The client certificate and key files of the moment (credentials from a plugin may
        change them), or None: then `client_cert_*`/`client_key_*` say what to present."""
        if self.credentials is not None:
            return self.credentials.client_certificate()
        return None

    def refresh_credentials(self) -> bool:
        """After a 401: authenticate again. True when the credentials may have changed."""
        if self.credentials is not None:
            return self.credentials.refresh()
        return self.token_file is not None


class _CapturedErrors(logging.Handler):
    """The library logs (instead of raising) what went wrong with an exec plugin; this keeps
    those messages so that corepin can raise them."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if f"kubernetes{os.sep}config" in record.pathname:
            self.messages.append(record.getMessage())


@contextmanager
def _library_errors(source: str) -> Iterator[_CapturedErrors]:
    captured = _CapturedErrors()
    root = logging.getLogger()
    root.addHandler(captured)
    try:
        yield captured
    except ConfigException as exc:
        raise KubeConfigError(source, str(exc).strip()) from exc
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise KubeConfigError(source, f"{type(exc).__name__}: {exc}") from exc
    finally:
        root.removeHandler(captured)


def _header(value: str | None) -> str | None:
    """The library's `api_key` value as an Authorization header: it keeps `Bearer x`, `bearer
    x\n` (a service account token file as read) or `Basic ...`."""
    if not value or not value.strip():
        return None
    scheme, _, rest = value.strip().partition(" ")
    if not rest.strip():
        return f"Bearer {scheme}"
    return f"Bearer {rest.strip()}" if scheme.lower() == "bearer" else f"{scheme} {rest.strip()}"


class LibraryCredentials:
    """Credentials kept by one of the library's loaders: `load_and_set` fills a library
    `Configuration` (and installs its refresh hook: an expired exec or oidc token, a service
    account token older than a minute, is renewed when the token is next asked for)."""

    def __init__(self, loader: KubeConfigLoader | InClusterConfigLoader, source: str) -> None:
        self._loader = loader
        self._source = source
        self._lock = threading.Lock()
        self._conf = self._load()

    def _load(self) -> Configuration:
        conf = Configuration()
        with _library_errors(self._source) as captured:
            self._loader.load_and_set(conf)  # type: ignore[no-untyped-call]
        if captured.messages:
            raise KubeConfigError(self._source, "; ".join(captured.messages))
        return conf

    @property
    def configuration(self) -> Configuration:
        """The library's configuration as last loaded (server, TLS files, proxy)."""
        with self._lock:
            return self._conf

    def authorization(self) -> str | None:
        with self._lock, _library_errors(self._source) as captured:
            value = self._conf.get_api_key_with_prefix("BearerToken")
            if captured.messages:
                raise KubeConfigError(self._source, "; ".join(captured.messages))
        return _header(value)

    def client_certificate(self) -> tuple[Path, Path] | None:
        with self._lock:
            cert, key = self._conf.cert_file, self._conf.key_file
        return (Path(cert), Path(key)) if cert and key else None

    def refresh(self) -> bool:
        with self._lock:
            self._conf = self._load()
        return True


def _yaml_current_context(path: Path) -> str:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return ""
    return str(doc.get("current-context") or "") if isinstance(doc, dict) else ""


_BASE64_KEYS = ("certificate-authority-data", "client-certificate-data", "client-key-data")


def _check_file(path: Path) -> None:
    """What the library would report obscurely, said plainly with the file's name."""
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise KubeConfigError(str(path), f"cannot read kubeconfig: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise KubeConfigError(str(path), f"not valid YAML: {exc}") from exc
    if doc is not None and not isinstance(doc, dict):
        raise KubeConfigError(str(path), "not a kubeconfig (expected a mapping)")
    for section in ("clusters", "users", "contexts"):
        entries = (doc or {}).get(section) or []
        if not isinstance(entries, list) or not all(
            isinstance(e, dict) and "name" in e for e in entries
        ):
            raise KubeConfigError(str(path), f"'{section}' must be a list of named entries")
        for entry in entries:
            body = entry.get(section[:-1]) or {}
            if not isinstance(body, dict):
                raise KubeConfigError(
                    str(path), f"{section[:-1]} {entry['name']!r} is not a mapping"
                )
            for key in _BASE64_KEYS:
                if key in body:
                    try:
                        base64.b64decode(str(body[key]), validate=True)
                    except (binascii.Error, ValueError) as exc:
                        raise KubeConfigError(str(path), f"{key} is not valid base64") from exc


def _entry(merged: Mapping[str, Any], section: str, name: str) -> dict[str, Any] | None:
    found = _entry_in(merged, section, name)
    return found[0] if found is not None else None


def _entry_in(
    merged: Mapping[str, Any], section: str, name: str
) -> tuple[dict[str, Any], Path] | None:
    """The named entry of a merged section, and the file it came from."""
    for item in merged.get(section) or []:
        if item["name"] == name:
            body = item.value if hasattr(item, "value") else item
            value = body.get(section[:-1]) or {}
            path = Path(str(getattr(item, "path", "") or "."))
            return dict(value.value if hasattr(value, "value") else value), path
    return None


def _token_file(merged: Mapping[str, Any], ctx: Mapping[str, Any]) -> Path | None:
    """The user's `tokenFile` when it is what authenticates (no token, no auth-provider): read
    on every request, as corepin always has, so a rotated file is used at once."""
    found = _entry_in(merged, "users", str(ctx.get("user") or ""))
    if found is None:
        return None
    user, origin = found
    if not user.get("tokenFile") or user.get("token") or user.get("auth-provider"):
        return None
    path = Path(os.path.expanduser(str(user["tokenFile"])))
    return path if path.is_absolute() else origin.parent / path


def _check_context(merged: Mapping[str, Any], chosen: str, source: str) -> dict[str, Any]:
    if not chosen:
        raise KubeConfigError(source, "no current-context is set and no context was given")
    ctx = _entry(merged, "contexts", chosen)
    if ctx is None:
        raise KubeConfigError(source, f"context {chosen!r} is not defined")
    cluster_name = str(ctx.get("cluster") or "")
    cluster = _entry(merged, "clusters", cluster_name)
    if cluster is None:
        raise KubeConfigError(
            source, f"context {chosen!r} names cluster {cluster_name!r}, which is not defined"
        )
    user_name = str(ctx.get("user") or "")
    if user_name and _entry(merged, "users", user_name) is None:
        raise KubeConfigError(
            source, f"context {chosen!r} names user {user_name!r}, which is not defined"
        )
    server = str(cluster.get("server") or "")
    if not server.startswith(("http://", "https://")):
        raise KubeConfigError(
            source, f"cluster {cluster_name!r} has no http(s) server (server: {server!r})"
        )
    return ctx


def load_kubeconfig(paths: list[Path], *, context: str | None = None) -> ClusterConfig:
    """The configuration a kubeconfig (or several, merged as kubectl does: the first file
    that names a cluster, user or context wins, and the first current-context) selects."""
    source = str(paths[0])
    existing = [p for p in paths if p.exists() or len(paths) == 1]
    for path in existing:
        _check_file(path)
    with _library_errors(source):
        merger = KubeConfigMerger(  # type: ignore[no-untyped-call]
            os.pathsep.join(str(p) for p in existing)
        )
    merged = merger.config
    if merged is None:
        raise KubeConfigError(source, "the kubeconfig is empty")
    current = next((c for c in map(_yaml_current_context, existing) if c), "")
    chosen = context or current
    ctx = _check_context(merged.value, chosen, source)
    with _library_errors(source):
        loader = KubeConfigLoader(  # type: ignore[no-untyped-call]
            config_dict=merged,
            active_context=chosen,
            config_base_path=None,
            config_persister=merger.save_changes,
        )
    credentials = LibraryCredentials(loader, source)
    conf = credentials.configuration
    return ClusterConfig(
        server=str(conf.host).rstrip("/"),
        source=source,
        ca_file=Path(conf.ssl_ca_cert) if conf.ssl_ca_cert else None,
        insecure_skip_tls_verify=not conf.verify_ssl,
        tls_server_name=conf.tls_server_name or None,
        proxy_url=conf.proxy or None,
        token_file=_token_file(merged.value, ctx),
        namespace=str(ctx.get("namespace") or "default"),
        context=chosen,
        credentials=credentials,
    )


def in_cluster_config(env: Mapping[str, str], root: Path = SERVICE_ACCOUNT_ROOT) -> ClusterConfig:
    """The pod's own service account: KUBERNETES_SERVICE_HOST/PORT and the files under `root`."""
    if not env.get("KUBERNETES_SERVICE_HOST") or not env.get("KUBERNETES_SERVICE_PORT"):
        raise KubeConfigError("in-cluster", "not in a pod (KUBERNETES_SERVICE_HOST/PORT unset)")
    token = root / "token"
    if not token.is_file():
        raise KubeConfigError(str(token), "service account token missing")
    ca = root / "ca.crt"
    loader = InClusterConfigLoader(  # type: ignore[no-untyped-call]
        token_filename=str(token),
        cert_filename=str(ca),
        try_refresh_token=True,
        environ=dict(env),
    )
    credentials = LibraryCredentials(loader, str(root))
    conf = credentials.configuration
    namespace_file = root / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.is_file() else "default"
    return ClusterConfig(
        server=str(conf.host),
        source="in-cluster",
        ca_file=Path(conf.ssl_ca_cert) if conf.ssl_ca_cert else None,
        namespace=namespace or "default",
        context="in-cluster",
        credentials=credentials,
    )


def home_kubeconfig(env: Mapping[str, str]) -> Path | None:
    """`$HOME/.kube/config` (None without a $HOME)."""
    home = env.get("HOME")
    return Path(home) / ".kube" / "config" if home else None


def load_config(
    kubeconfig: str | Path | None = None,
    *,
    env: Mapping[str, str],
    service_account_root: Path = SERVICE_ACCOUNT_ROOT,
    context: str | None = None,
) -> ClusterConfig:
    """`kubeconfig` if given, else `$KUBECONFIG` from `env`, else `$HOME/.kube/config`, else
    the in-cluster account; `context` instead of the current context of a kubeconfig."""
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
    home = home_kubeconfig(env)
    if home is not None and home.exists():
        return load_kubeconfig([home], context=context)
    if env.get("KUBERNETES_SERVICE_HOST") and env.get("KUBERNETES_SERVICE_PORT"):
        if context:
            raise KubeConfigError(
                "in-cluster", f"--context {context} needs a kubeconfig, and none was found"
            )
        return in_cluster_config(env, service_account_root)
    raise KubeConfigError(
        "kubeconfig",
        "none found: no --kubeconfig, no $KUBECONFIG, no "
        f"{home if home is not None else '$HOME/.kube/config'}, and not in a pod "
        "(KUBERNETES_SERVICE_HOST/PORT unset)",
    )
