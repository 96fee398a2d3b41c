"""`corepin scheduler` and `corepin extender` as processes: /healthz and /metrics, a stop on
SIGTERM within 5 s, exit 4 with one line when the API is unreachable, exit 2 on bad flags."""

from __future__ import annotations

import http.client
import json
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from corepin.kube.client import KubeClient
from corepin.kube.resources import PODS
from corepin.state.model import HostState
from corepin.testing import machines as synthetic
from corepin.testing.fakeapi import TLSMaterial, make_tls
from corepin.testing.fakeapi.tls import CertFiles
from support.helpers import corepin_argv, reap, run_corepin, wait_for
from support.kube_helpers import install_crds
from support.placement_publish import publish
from support.pods import EXCLUSIVE, container, pod
from support.ports import free_port

SMALL = synthetic.named("single_socket_ht")


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def stop_within_5_s(proc: subprocess.Popen[str]) -> None:
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=10)
    assert time.monotonic() - started < 5.0, "stopped within 5 s"
    assert code == 0, proc.stderr.read() if proc.stderr else ""


def _https(
    port: int, ca: Path, client: CertFiles | None, method: str, path: str, body: bytes = b""
) -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=str(ca))
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        conn.request(method, path, body=body or None)
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def test_the_extender_serves_filters_over_mutual_tls_and_stops_on_sigterm(
    kube: KubeClient, fake_kubeconfig: Path, tls_material: TLSMaterial, tmp_path: Path
) -> None:
    install_crds(kube)
    publish(kube, "n1", HostState.new(SMALL), SMALL)
    port, ops_port = free_port(), free_port()
    tls = tls_material
    proc = subprocess.Popen(
        corepin_argv(
            "extender",
            "--kubeconfig",
            str(fake_kubeconfig),
            "--address",
            f"127.0.0.1:{port}",
            "--tls-cert",
            str(tls.server.cert),
            "--tls-key",
            str(tls.server.key),
            "--client-ca",
            str(tls.ca.cert),
            "--metrics-address",
            f"127.0.0.1:{ops_port}",
        ),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{ops_port}"  # probes and scrapes: plain HTTP, no certificate
        wait_for(lambda: get(f"{base}/healthz")[0] == 200, timeout=30, what="extender ready")
        body = json.dumps(
            {
                "Pod": pod("p", container("app", "2", "2"), annotations=EXCLUSIVE),
                "Nodes": None,
                "NodeNames": ["n1", "n2"],
            }
        ).encode()
        scheduler = tls.client("kube-scheduler")
        status, raw = _https(port, tls.ca.cert, scheduler, "POST", "/filter", body)
        result = json.loads(raw)
        assert status == 200
        assert result["NodeNames"] == ["n1"] and list(result["FailedAndUnresolvableNodes"]) == [
            "n2"
        ]
        # no client certificate, or one another CA signed: the handshake fails
        stranger = make_tls(tmp_path / "other").client("kube-scheduler")
        for client in (None, stranger):
            with pytest.raises((ssl.SSLError, ConnectionError)):
                _https(port, tls.ca.cert, client, "POST", "/filter", body)
        # and plain HTTP gets no answer
        assert get(f"http://127.0.0.1:{port}/healthz")[0] == 0
        status, metrics = get(f"{base}/metrics")
        assert status == 200
        assert 'corepin_placement_requests_total{code="200",verb="filter"} 1.0' in metrics
        wait_for(
            lambda: "corepin_placement_nodes 1.0" in get(f"{base}/metrics")[1],
            what="the nodes gauge",
        )
        stop_within_5_s(proc)
    finally:
        reap(proc)


@pytest.mark.parametrize(
    ("opt_in", "warned"),
    [(["--insecure-http"], False), ([], True)],
    ids=["told to (--insecure-http)", "no TLS flag at all (the contract's command line)"],
)
def test_the_extender_serves_plain_http_without_tls_flags_and_warns_unless_told(
    kube: KubeClient, fake_kubeconfig: Path, opt_in: list[str], warned: bool
) -> None:
    install_crds(kube)
    port = free_port()
    proc = subprocess.Popen(
        corepin_argv(
            "extender",
            "--kubeconfig",
            str(fake_kubeconfig),
            "--address",
            f"127.0.0.1:{port}",
            *opt_in,
        ),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: get(f"{base}/healthz")[0] == 200, timeout=30, what="extender ready")
        stop_within_5_s(proc)
        assert proc.stderr is not None
        said = proc.stderr.read()
        assert ("without client authentication" in said) is warned, said
    finally:
        reap(proc)


def test_the_scheduler_binds_serves_its_metrics_and_stops_on_sigterm(
    kube: KubeClient, fake_kubeconfig: Path
) -> None:
    install_crds(kube)
    publish(kube, "n1", HostState.new(SMALL), SMALL)
    body = pod(
        "p", container("app", "2", "2"), annotations=EXCLUSIVE, scheduler="corepin-scheduler"
    )
    del body["metadata"]["uid"]
    kube.create(PODS, body, "default")
    port = free_port()
    proc = subprocess.Popen(
        corepin_argv(
            "scheduler",
            "--kubeconfig",
            str(fake_kubeconfig),
            "--metrics-address",
            f"127.0.0.1:{port}",
            "--leader-elect-namespace",
            "default",
        ),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: get(f"{base}/healthz")[0] == 200, timeout=30, what="scheduler ready")
        wait_for(
            lambda: kube.get(PODS, "p", "default")["spec"].get("nodeName") == "n1",
            timeout=30,
            what="the pod bound to n1",
        )
        wait_for(
            lambda: (
                'corepin_placement_bindings_total{result="bound"} 1.0' in get(f"{base}/metrics")[1]
            ),
            what="the bind counted in /metrics",
        )
        stop_within_5_s(proc)
    finally:
        reap(proc)


def _unreachable_kubeconfig(tmp: Path) -> Path:
    path = tmp / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


@pytest.mark.parametrize(
    "argv",
    [
        ["extender", "--address", "127.0.0.1:0", "--insecure-http"],
        ["scheduler", "--metrics-address", "127.0.0.1:0"],
    ],
    ids=["extender", "scheduler"],
)
def test_an_unreachable_api_exits_4_with_one_line(tmp_path: Path, argv: list[str]) -> None:
    kubeconfig = _unreachable_kubeconfig(tmp_path)
    out = run_corepin(*argv, "--kubeconfig", str(kubeconfig), timeout=60)
    assert out.returncode == 4, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "127.0.0.1:9" in out.stderr


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["extender"], "--address"),
        (["extender", "--address", "nowhere"], "HOST:PORT"),
        (
            ["extender", "--address", "127.0.0.1:0", "--tls-cert", "c", "--tls-key", "k"],
            "give --client-ca",
        ),
        (
            ["extender", "--address", "127.0.0.1:0", "--insecure-http", "--client-ca", "c"],
            "drop --client-ca",
        ),
        (["scheduler", "--profile", "Fastest"], "Fastest"),
        (["scheduler", "--stale-after", "0"], "positive"),
    ],
    ids=[
        "no address",
        "a bad address",
        "no client CA",
        "TLS flags with --insecure-http",
        "an unknown profile",
        "a stale-after of 0",
    ],
)
def test_bad_flags_exit_2_naming_them(tmp_path: Path, argv: list[str], words: str) -> None:
    out = run_corepin(*argv, "--kubeconfig", str(_unreachable_kubeconfig(tmp_path)), timeout=60)
    assert out.returncode == 2, out.stderr
    assert words in out.stderr
