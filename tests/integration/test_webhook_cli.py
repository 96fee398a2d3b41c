"""`corepin webhook` as a real process: HTTPS with a certificate made at test time, the capacity
rule fed by the fake API server's NodeCPUTopologies, SIGTERM within 5 s, exit 4 with one line
for a bad certificate file or an unreachable API, exit 2 for a bad flag."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from corepin.kube.client import KubeClient
from corepin.kube.resources import NCPT
from corepin.testing.fakeapi import TLSMaterial
from corepin.testing.machines import named
from support.helpers import run_corepin, wait_for
from support.kube_helpers import install_crds
from support.paths import REPO
from support.pods import EXCLUSIVE, container, pod
from support.ports import free_port
from support.webhook_helpers import ncpt, review
from support.webhook_process import WebhookProcess, clean_env


@pytest.fixture
def process(tls_material: TLSMaterial) -> Iterator[WebhookProcess]:
    proc = WebhookProcess(tls_material)
    yield proc
    proc.kill()


def test_the_webhook_answers_over_https_and_stops_on_sigterm_within_5_s(
    process: WebhookProcess,
) -> None:
    answer = process.post(
        "/mutate", review(pod("web-0", container("app", "2"), annotations=EXCLUSIVE))
    )
    assert answer["response"]["patchType"] == "JSONPatch"
    refused = process.post(
        "/validate", review(pod("web-0", container("app"), annotations=EXCLUSIVE))
    )
    assert refused["response"]["allowed"] is False
    assert 'outcome="denied"} 1.0' in process.metrics()
    # an idle keep-alive connection must not hold the process up
    idle = process.context.wrap_socket(
        socket.create_connection(("127.0.0.1", process.port)), server_hostname="127.0.0.1"
    )
    code, seconds, err = process.terminate()
    idle.close()
    assert (code, err) == (0, "")
    assert seconds < 5


def test_without_the_api_the_capacity_rule_is_off(process: WebhookProcess) -> None:
    huge = review(pod("web-0", container("app", "4096"), annotations=EXCLUSIVE))
    assert process.post("/validate", huge)["response"]["allowed"] is True
    assert "corepin_webhook_node_topologies 0.0" in process.metrics()


def test_the_capacity_rule_follows_the_published_node_topologies(
    kube: KubeClient, fake_kubeconfig: Path, tls_material: TLSMaterial
) -> None:
    install_crds(kube, "nodecputopologies")
    kube.create(NCPT, ncpt("node-a", named("dual_socket_ht")))
    proc = WebhookProcess(tls_material, "--kubeconfig", str(fake_kubeconfig), "-v")
    try:
        huge = review(pod("web-0", container("db", "40"), annotations=EXCLUSIVE))
        small = review(pod("web-0", container("db", "8"), annotations=EXCLUSIVE))

        def refused() -> bool:
            return proc.post("/validate", huge)["response"]["allowed"] is False

        wait_for(refused, timeout=20, what="the NodeCPUTopology to reach the webhook")
        message = proc.post("/validate", huge)["response"]["status"]["message"]
        assert message.startswith("container 'db' asks for 40 exclusive CPUs")
        assert "node-a: 32 online CPUs" in message
        assert proc.post("/validate", small)["response"]["allowed"] is True
        assert "corepin_webhook_node_topologies 1.0" in proc.metrics()
        bigger = ncpt("node-b", named("large_64"))
        kube.create(NCPT, bigger)
        wait_for(lambda: not refused(), timeout=20, what="the bigger node to count")
        kube.delete(NCPT, "node-b")
        wait_for(refused, timeout=20, what="the bigger node to be gone")
        code, seconds, _ = proc.terminate()
        assert code == 0 and seconds < 5
    finally:
        proc.kill()


# ---------------------------------------------------------------------- refusals at start
def start_fails(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    done = run_corepin("webhook", *args, env=env or clean_env(), timeout=60)
    assert done.stdout == ""
    return done.returncode, done.stderr


def test_a_bad_certificate_file_exits_4_naming_it(
    tls_material: TLSMaterial, tmp_path: Path
) -> None:
    missing = tmp_path / "missing.crt"
    code, err = start_fails(
        "--address", "127.0.0.1:0", "--tls-cert", str(missing), "--tls-key",
        str(tls_material.server.key),
    )  # fmt: skip
    assert code == 4
    assert err == (
        f"corepin webhook: {missing}: cannot read the TLS certificate: No such file or directory\n"
    )
    code, err = start_fails(
        "--address", "127.0.0.1:0", "--tls-cert", str(tls_material.server.cert), "--tls-key",
        str(tls_material.server.cert),
    )  # fmt: skip
    assert code == 4 and err.count("\n") == 1
    assert f"{tls_material.server.cert}: no PEM private key in it" in err


def test_an_unreachable_api_exits_4_with_one_line(
    tls_material: TLSMaterial, tmp_path: Path
) -> None:
    port = free_port()  # nothing listens there
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    tls = ["--tls-cert", str(tls_material.server.cert), "--tls-key", str(tls_material.server.key)]
    for args, env in (
        (["--kubeconfig", str(kubeconfig)], None),
        ([], {**clean_env(), "KUBECONFIG": str(kubeconfig)}),
    ):
        started = time.monotonic()
        code, err = start_fails("--address", "127.0.0.1:0", *tls, *args, env=env)
        assert code == 4 and err.count("\n") == 1, err
        assert err.startswith("corepin webhook: ") and "unreachable" in err
        assert time.monotonic() - started < 30
    code, err = start_fails(
        "--address", "127.0.0.1:0", *tls, "--kubeconfig", str(tmp_path / "nope")
    )
    assert code == 4 and "no such kubeconfig file" in err


@pytest.mark.parametrize(
    ("flag", "problem"),
    [
        (["--toleration", "dedicated:NoRun"], "the effect must be one of"),
        (["--node-selector", "zone"], "expected KEY=VALUE"),
        (["--node-selector", "a=1", "--node-selector", "a=2"], "given twice"),
        (["--assignment-dir-host", "run/corepin"], "must be an absolute path"),
        (["--address", "9443"], "bad address"),
    ],
)
def test_a_bad_flag_exits_2_with_one_line(
    tls_material: TLSMaterial, flag: list[str], problem: str
) -> None:
    args = ["--tls-cert", str(tls_material.server.cert), "--tls-key", str(tls_material.server.key)]
    if "--address" not in flag:
        args += ["--address", "127.0.0.1:0"]
    code, err = start_fails(*args, *flag)
    assert code == 2 and err.count("\n") == 1 and problem in err, err


def test_the_command_is_listed_and_documents_its_flags() -> None:
    assert "webhook" in run_corepin("--help").stdout
    text = run_corepin("webhook", "--help").stdout
    for flag in (
        "--kubeconfig", "--address", "--tls-cert", "--tls-key", "--scheduler-name",
        "--assignment-dir-host", "--node-selector", "--toleration",
    ):  # fmt: skip
        assert flag in text


def test_the_deployment_args_parse_and_the_configurations_call_real_endpoints() -> None:
    from corepin.api.webhook.app import AdmissionApp
    from corepin.cli.main import build_parser
    from corepin.cli.webhook_cmd import config_from

    docs = list(yaml.safe_load_all((REPO / "deploy" / "webhook" / "deployment.yaml").read_text()))
    (c,) = docs[0]["spec"]["template"]["spec"]["containers"]
    args = build_parser("webhook").parse_args(c["args"])
    config = config_from(args)
    assert args.address == ":9443" and config.assignment_dir_host == "/run/corepin/assignments"
    paths = {
        hook["clientConfig"]["service"]["path"]: (doc["kind"], hook)
        for doc in yaml.safe_load_all((REPO / "deploy" / "webhook" / "webhooks.yaml").read_text())
        for hook in doc["webhooks"]
    }
    assert set(paths) == set(AdmissionApp(config).routes())
    assert paths["/mutate"][0] == "MutatingWebhookConfiguration"
    for _, hook in paths.values():  # what the README and deploy/README.md say
        assert (hook["failurePolicy"], hook["timeoutSeconds"]) == ("Ignore", 5)
