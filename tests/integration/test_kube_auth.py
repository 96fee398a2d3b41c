"""Authentication against the fake API server requiring it: an exec credential plugin (a real
script that counts its runs in a file) whose token is used until it expires, run again when it
has expired or when the server answers 401, or that hands out a client certificate; `--context`
choosing between two API servers; `$HOME/.kube/config` when there is no $KUBECONFIG; and
`kubectl corepin report NODE` (the `kubectl-corepin` console script) with all of these."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import socket
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from corepin.core.errors import ApiError, ApiUnreachable, KubeConfigError
from corepin.kube.client import KubeClient
from corepin.kube.config import load_config
from corepin.kube.resources import CRDS, NCPT, PODS
from corepin.testing.fakeapi import FakeApiServer, TLSMaterial
from support.crd_schema import crd, load_yaml_docs
from support.paths import DEPLOY

V1 = "client.authentication.k8s.io/v1"
V1BETA1 = "client.authentication.k8s.io/v1beta1"
FAR = "2099-01-01T00:00:00Z"
PAST = "2000-01-01T00:00:00Z"

#: The plugin: counts its runs in $PLUGIN_COUNT, answers `tok-N` for run N (or the client
#: certificate in $PLUGIN_CERT/$PLUGIN_KEY), with $PLUGIN_EXPIRY as its expirationTimestamp, in
#: the apiVersion kubectl's KUBERNETES_EXEC_INFO asked for.
PLUGIN = """\
#!{python}
import json, os, sys
count = os.environ["PLUGIN_COUNT"]
n = int(open(count).read()) + 1 if os.path.exists(count) else 1
with open(count, "w") as f:
    f.write(str(n))
if os.environ.get("PLUGIN_CERT"):
    status = {{
        "clientCertificateData": open(os.environ["PLUGIN_CERT"]).read(),
        "clientKeyData": open(os.environ["PLUGIN_KEY"]).read(),
    }}
else:
    status = {{"token": "tok-%d" % n}}
if os.environ.get("PLUGIN_EXPIRY"):
    status["expirationTimestamp"] = os.environ["PLUGIN_EXPIRY"]
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
json.dump({{"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": status}},
          sys.stdout)
"""


class Plugin:
    """The plugin script of one test and the file that counts its runs."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "credential-plugin"
        self.path.write_text(PLUGIN.format(python=sys.executable))
        self.path.chmod(0o755)
        self.counter = directory / "plugin-runs"

    @property
    def runs(self) -> int:
        return int(self.counter.read_text()) if self.counter.exists() else 0

    def user(self, api_version: str = V1, **env: str) -> dict[str, Any]:
        """A kubeconfig user that runs this plugin with `env` (PLUGIN_EXPIRY, ...)."""
        values = {"PLUGIN_COUNT": str(self.counter), **env}
        return {
            "exec": {
                "apiVersion": api_version,
                "command": str(self.path),
                "env": [{"name": k, "value": v} for k, v in values.items()],
                "interactiveMode": "Never",
            }
        }


def write_kubeconfig(
    path: Path, contexts: dict[str, tuple[dict[str, Any], dict[str, Any]]], current: str
) -> Path:
    """A kubeconfig with one context per entry: its name -> (cluster, user)."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": f"{n}-cluster", "cluster": c} for n, (c, _) in contexts.items()],
        "users": [{"name": f"{n}-user", "user": u} for n, (_, u) in contexts.items()],
        "contexts": [
            {"name": n, "context": {"cluster": f"{n}-cluster", "user": f"{n}-user"}}
            for n in contexts
        ],
        "current-context": current,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def tokens(count: int = 20) -> dict[str, str]:
    """What the fake accepts: `tok-N` is user `user-N`."""
    return {f"tok-{n}": f"user-{n}" for n in range(1, count + 1)}


@contextlib.contextmanager
def client(path: Path, context: str | None = None) -> Iterator[KubeClient]:
    kube = KubeClient.from_config(load_config(path, env={}, context=context), timeout=10)
    with contextlib.closing(kube):
        yield kube


def users(api: FakeApiServer) -> list[str]:
    return [r.user for r in api.recorded(verb="list")]


# ---------------------------------------------------------------------- exec plugins
@pytest.mark.parametrize("api_version", [V1, V1BETA1])
def test_exec_token_is_used_until_it_expires(tmp_path: Path, api_version: str) -> None:
    plugin = Plugin(tmp_path)
    with FakeApiServer(tokens=tokens()) as api:
        path = write_kubeconfig(
            tmp_path / "kc",
            {"fake": ({"server": api.url}, plugin.user(api_version, PLUGIN_EXPIRY=FAR))},
            "fake",
        )
        with client(path) as kube:
            for _ in range(3):
                kube.list(PODS, "default")
        assert plugin.runs == 1
        assert users(api) == ["user-1"] * 3


def test_an_expired_exec_token_runs_the_plugin_again(tmp_path: Path) -> None:
    plugin = Plugin(tmp_path)
    with FakeApiServer(tokens=tokens()) as api:
        path = write_kubeconfig(
            tmp_path / "kc",
            {"fake": ({"server": api.url}, plugin.user(PLUGIN_EXPIRY=PAST))},
            "fake",
        )
        with client(path) as kube:
            assert plugin.runs == 1, "run once when the configuration is loaded"
            kube.list(PODS, "default")
            kube.list(PODS, "default")
        assert plugin.runs == 3, "an expired token is renewed before each request"
        assert users(api) == ["user-2", "user-3"]


def test_a_401_runs_the_plugin_again_and_the_request_is_retried_once(tmp_path: Path) -> None:
    plugin = Plugin(tmp_path)
    with FakeApiServer(tokens=tokens()) as api:
        path = write_kubeconfig(
            tmp_path / "kc",
            {"fake": ({"server": api.url}, plugin.user(V1BETA1, PLUGIN_EXPIRY=FAR))},
            "fake",
        )
        with client(path) as kube:
            kube.list(PODS, "default")
            del api.tokens["tok-1"]  # revoked before it expired
            kube.list(PODS, "default")
            assert plugin.runs == 2
            sent = [r.user for r in api.recorded(method="GET")]
            assert sent == ["user-1", "", "user-2"], "refused, then the new token"
            api.tokens.clear()  # nothing the plugin hands out is accepted any more
            with pytest.raises(ApiError) as refused:
                kube.list(PODS, "default")
            assert refused.value.code == 401
            assert plugin.runs == 3, "one renewal per refused request, no loop"


def test_exec_plugin_handing_out_a_client_certificate(
    tls_material: TLSMaterial, tmp_path: Path
) -> None:
    plugin = Plugin(tmp_path)
    cert = tls_material.client("carol", ("corepin",))
    user = plugin.user(PLUGIN_CERT=str(cert.cert), PLUGIN_KEY=str(cert.key), PLUGIN_EXPIRY=FAR)
    with FakeApiServer(tls=tls_material, client_certs=True) as api:
        cluster = {"server": api.url, "certificate-authority": str(tls_material.ca.cert)}
        path = write_kubeconfig(tmp_path / "kc", {"fake": (cluster, user)}, "fake")
        with client(path) as kube:
            kube.list(PODS, "default")
        assert users(api) == ["carol"] and plugin.runs == 1


def test_client_certificate_data_in_the_kubeconfig(
    tls_material: TLSMaterial, tmp_path: Path
) -> None:
    cert = tls_material.client("dave")
    user = {
        "client-certificate-data": base64.b64encode(cert.cert_pem()).decode(),
        "client-key-data": base64.b64encode(cert.key_pem()).decode(),
    }
    with FakeApiServer(tls=tls_material, client_certs=True) as api:
        cluster = {
            "server": api.url,
            "certificate-authority-data": base64.b64encode(tls_material.ca.cert_pem()).decode(),
        }
        path = write_kubeconfig(tmp_path / "kc", {"fake": (cluster, user)}, "fake")
        with client(path) as kube:
            kube.list(PODS, "default")
        assert users(api) == ["dave"]


def test_context_chooses_between_two_api_servers(tmp_path: Path) -> None:
    plugin = Plugin(tmp_path)
    with FakeApiServer(tokens=tokens()) as one, FakeApiServer(tokens={"static": "bob"}) as two:
        path = write_kubeconfig(
            tmp_path / "kc",
            {
                "one": ({"server": one.url}, plugin.user(PLUGIN_EXPIRY=FAR)),
                "two": ({"server": two.url}, {"token": "static"}),
            },
            "one",
        )
        with client(path) as kube:
            kube.list(PODS, "default")
        with client(path, context="two") as kube:
            kube.list(PODS, "default")
        assert users(one) == ["user-1"] and users(two) == ["bob"]


# ---------------------------------------------------------------------- TLS name, proxy
def test_tls_server_name_is_the_name_the_certificate_must_carry(
    tls_material: TLSMaterial, tmp_path: Path
) -> None:
    with FakeApiServer(tls=tls_material, tokens={"static": "bob"}) as api:
        ca = str(tls_material.ca.cert)
        for name, trusted in (("localhost", True), ("api.elsewhere.example", False)):
            cluster = {"server": api.url, "certificate-authority": ca, "tls-server-name": name}
            path = write_kubeconfig(tmp_path / name, {"c": (cluster, {"token": "static"})}, "c")
            with client(path) as kube:
                if trusted:
                    kube.list(PODS, "default")
                else:
                    with pytest.raises(ApiUnreachable, match="certificate"):
                        kube.list(PODS, "default")
        assert users(api) == ["bob"]


class ConnectProxy(socketserver.ThreadingTCPServer):
    """An HTTP CONNECT proxy on loopback that records each tunnel's target and the
    Proxy-Authorization it was given."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Tunnel)
        self.tunnels: list[tuple[str, str]] = []
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://proxyuser:s%40cret@127.0.0.1:{self.server_address[1]}"

    def __enter__(self) -> ConnectProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(5)


class _Tunnel(socketserver.StreamRequestHandler):
    server: ConnectProxy
    rbufsize = 0  # nothing past the CONNECT request's headers is read before the relay

    def handle(self) -> None:
        request = self.rfile.readline().decode()
        headers = {}
        while (line := self.rfile.readline().decode().strip()) != "":
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        method, target, _ = request.split(" ", 2)
        self.server.tunnels.append((target, headers.get("proxy-authorization", "")))
        if method != "CONNECT":
            self.wfile.write(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
            return
        host, port = target.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as upstream:
            self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            self.wfile.flush()
            sockets = [self.connection, upstream]
            while True:
                readable, _, _ = select.select(sockets, [], [], 10)
                if not readable:
                    return
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    (upstream if sock is self.connection else self.connection).sendall(data)


@pytest.mark.parametrize("https", [False, True], ids=["http", "https"])
def test_proxy_url_tunnels_the_requests(
    tls_material: TLSMaterial, tmp_path: Path, https: bool
) -> None:
    with (
        FakeApiServer(tls=tls_material if https else None, tokens={"static": "bob"}) as api,
        ConnectProxy() as proxy,
    ):
        cluster: dict[str, Any] = {"server": api.url, "proxy-url": proxy.url}
        if https:
            cluster["certificate-authority"] = str(tls_material.ca.cert)
        path = write_kubeconfig(tmp_path / "kc", {"c": (cluster, {"token": "static"})}, "c")
        with client(path) as kube:
            kube.list(PODS, "default")
        port = api.url.rsplit(":", 1)[1]
        credentials = base64.b64encode(b"proxyuser:s@cret").decode()
        assert proxy.tunnels == [(f"127.0.0.1:{port}", f"Basic {credentials}")]
        assert users(api) == ["bob"]


def test_a_socks_proxy_is_refused_by_name(tmp_path: Path) -> None:
    cluster = {"server": "https://127.0.0.1:1", "proxy-url": "socks5://127.0.0.1:1080"}
    path = write_kubeconfig(tmp_path / "kc", {"c": (cluster, {"token": "t"})}, "c")
    with pytest.raises(KubeConfigError, match=r"socks5://127\.0\.0\.1:1080"):
        KubeClient.from_config(load_config(path, env={}))


# ---------------------------------------------------------------------- kubectl corepin
def plugin_command() -> str:
    """The `kubectl-corepin` console script of this environment."""
    found = shutil.which("kubectl-corepin", path=os.path.dirname(sys.executable))
    if found is None:
        pytest.skip("kubectl-corepin is not installed in this environment (pip install -e .)")
    return found


def publish(api: FakeApiServer, tmp_path: Path, node: str) -> None:
    """The CRD and a NodeCPUTopology named `node` (the sample's), as an agent publishes it."""
    path = api.write_kubeconfig(tmp_path / f"admin-{node}", token="admin")
    with client(path) as kube:
        kube.create(CRDS, crd("nodecputopologies"))
        (obj,) = load_yaml_docs(DEPLOY / "samples" / "nodecputopology.yaml")
        obj["metadata"]["name"] = node
        status = obj.pop("status")
        created = kube.create(NCPT, obj)
        created["status"] = status
        kube.replace_status(NCPT, created)


def kubectl_corepin(home: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")
    }
    env.update(HOME=str(home), **extra)
    return subprocess.run(
        [plugin_command(), *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def two_clusters(tmp_path: Path) -> Iterator[tuple[FakeApiServer, FakeApiServer]]:
    """Two API servers: `worker-1` on the first (exec plugin users), `worker-2` on the
    second (a token); both require authentication."""
    with (
        FakeApiServer(tokens={**tokens(), "admin": "admin"}) as one,
        FakeApiServer(tokens={"static": "bob", "admin": "admin"}) as two,
    ):
        publish(one, tmp_path, "worker-1")
        publish(two, tmp_path, "worker-2")
        yield one, two


def test_kubectl_corepin_with_the_home_kubeconfig_an_exec_user_and_context(
    two_clusters: tuple[FakeApiServer, FakeApiServer], tmp_path: Path
) -> None:
    one, two = two_clusters
    plugin = Plugin(tmp_path)
    home = tmp_path / "home"
    write_kubeconfig(
        home / ".kube" / "config",
        {
            "one": ({"server": one.url}, plugin.user(PLUGIN_EXPIRY=FAR)),
            "two": ({"server": two.url}, {"token": "static"}),
        },
        "one",
    )
    done = kubectl_corepin(home, "report", "worker-1", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)["allocations"]) == 2
    assert plugin.runs == 1 and {r.user for r in one.recorded(verb="get")} == {"user-1"}
    other = kubectl_corepin(home, "report", "--context", "two", "worker-2", "-o", "json")
    assert other.returncode == 0, other.stderr
    assert {r.user for r in two.recorded(verb="get")} == {"bob"}
    absent = kubectl_corepin(home, "report", "worker-2")
    assert absent.returncode == 2 and "worker-2" in absent.stderr, "the current context: one"
    assert absent.stderr.count("\n") == 1
    unknown = kubectl_corepin(home, "report", "worker-1", "--context", "three")
    assert unknown.returncode == 4 and "context 'three' is not defined" in unknown.stderr
    assert unknown.stderr.count("\n") == 1


def test_kubectl_corepin_with_kubeconfig_variable_and_exec_user(
    two_clusters: tuple[FakeApiServer, FakeApiServer], tmp_path: Path
) -> None:
    one, _ = two_clusters
    plugin = Plugin(tmp_path)
    path = write_kubeconfig(
        tmp_path / "kc", {"one": ({"server": one.url}, plugin.user(V1BETA1))}, "one"
    )
    done = kubectl_corepin(tmp_path / "nohome", "report", "worker-1", KUBECONFIG=str(path))
    assert done.returncode == 0, done.stderr
    assert "shop/db-0/postgres" in done.stdout and plugin.runs == 1


def test_kubectl_corepin_without_any_configuration_says_what_it_looked_for(
    tmp_path: Path,
) -> None:
    done = kubectl_corepin(tmp_path, "report", "worker-1")
    assert done.returncode == 4
    assert done.stderr.count("\n") == 1
    for looked_for in ("--kubeconfig", "$KUBECONFIG", f"{tmp_path}/.kube/config", "not in a pod"):
        assert looked_for in done.stderr


def test_a_failing_exec_plugin_is_one_line_naming_it(tmp_path: Path) -> None:
    user = {
        "exec": {
            "apiVersion": V1,
            "command": "sh",
            "args": ["-c", "echo 'run: aws sso login' >&2; exit 1"],
        }
    }
    write_kubeconfig(
        tmp_path / ".kube" / "config", {"one": ({"server": "http://127.0.0.1:1"}, user)}, "one"
    )
    done = kubectl_corepin(tmp_path, "report", "worker-1")
    assert done.returncode == 4 and done.stderr.count("\n") == 1
    assert "exec: process returned 1. run: aws sso login" in done.stderr
