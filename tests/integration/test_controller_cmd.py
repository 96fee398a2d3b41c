"""The real `corepin controller` command in a child process: it validates bindings on the fake
API server, serves /healthz and /metrics, stops on SIGTERM within 5 s releasing its Lease,
hands over to a standby, and exits 4 with one line when the API cannot be used at start."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from corepin.kube.client import KubeClient
from corepin.kube.resources import LEASES
from corepin.testing.machines import dual_socket_ht
from support.controller_helpers import (
    binding,
    create_binding,
    create_pod,
    ncpt,
    publish,
    wait_phase,
)
from support.helpers import corepin_argv, reap, run_corepin, wait_for
from support.kube_helpers import install_crds
from support.pods import container


class Running:
    """A `corepin controller` child process with its stderr collected line by line."""

    def __init__(self, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "COREPIN_LOG")}
        self.proc = subprocess.Popen(
            corepin_argv("controller", *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, pattern: str, timeout: float = 20) -> re.Match[str]:
        found: list[re.Match[str]] = []

        def seen() -> bool:
            for line in list(self.lines):
                match = re.search(pattern, line)
                if match:
                    found.append(match)
                    return True
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode}: {self.lines}")
            return False

        wait_for(seen, timeout, f"a log line matching {pattern!r}")
        return found[0]

    @property
    def address(self) -> str:
        return "127.0.0.1:" + self.wait_line(r"http_serving address=\S+ port=(\d+)").group(1)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://{self.address}{path}", timeout=5) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def terminate(self) -> tuple[int, float]:
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=10)
        self._reader.join(5)
        return code, time.monotonic() - started

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self._reader.join(5)  # it reads stderr to the end, then the pipes can close
        reap(self.proc)


@pytest.fixture
def controllers() -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for one in started:
        one.kill()


def start(controllers: list[Running], kubeconfig: Path, identity: str) -> Running:
    one = Running(
        "--kubeconfig",
        str(kubeconfig),
        "--metrics-address",
        "127.0.0.1:0",
        "--identity",
        identity,
        "--lease-namespace",
        "default",
        "--lease-duration",
        "3",
        "--renew-deadline",
        "2",
        "--retry-period",
        "0.3",
    )
    controllers.append(one)
    return one


def holder(kube: KubeClient) -> str:
    return str(kube.get(LEASES, "corepin-controller", "default")["spec"]["holderIdentity"])


def test_the_command_validates_serves_and_stops_on_sigterm_releasing_the_lease(
    kube: KubeClient, fake_kubeconfig: Path, controllers: list[Running]
) -> None:
    install_crds(kube)
    publish(kube, ncpt("worker-1", dual_socket_ht()))
    one = start(controllers, fake_kubeconfig, "ctl-a")
    one.wait_line(r"event=leading identity=ctl-a")
    create_pod(kube, "web", container("app", "1", "1"))
    create_binding(kube, binding("web", "web", cpus="2"))
    wait_phase(kube, "web", "Validated", timeout=20)
    wait_for(lambda: one.get("/healthz") == (200, "ok\n"), 10, "healthz ok")
    code, text = one.get("/metrics")
    assert code == 200 and "corepin_controller_leader 1.0" in text
    line = one.wait_line(r"event=binding_status binding=default/web phase=Validated")
    assert re.match(r"^\S+ level=INFO logger=corepin\.controller event=", line.string)
    assert holder(kube) == "ctl-a"
    code, seconds = one.terminate()
    assert code == 0, one.lines
    assert seconds < 5.0
    assert holder(kube) == "", "the Lease is released on the way out"
    assert any("event=stopped identity=ctl-a clean=True" in line for line in one.lines)


def test_a_standby_serves_health_only_and_takes_over_when_the_leader_terminates(
    kube: KubeClient, fake_kubeconfig: Path, controllers: list[Running]
) -> None:
    install_crds(kube)
    publish(kube, ncpt("worker-1", dual_socket_ht()))
    first = start(controllers, fake_kubeconfig, "ctl-a")
    first.wait_line(r"event=leading identity=ctl-a")
    second = start(controllers, fake_kubeconfig, "ctl-b")
    second.wait_line(r"event=new_leader leader=ctl-a identity=ctl-b")
    assert second.get("/healthz") == (200, "ok\n"), "a standby is healthy"
    assert "corepin_controller_leader 0.0" in second.get("/metrics")[1]
    code, _ = first.terminate()
    assert code == 0
    second.wait_line(r"event=leading identity=ctl-b", timeout=10)
    create_pod(kube, "web", container("app", "1", "1"))
    create_binding(kube, binding("web", "web", cpus="2"))
    wait_phase(kube, "web", "Validated", timeout=20)
    assert holder(kube) == "ctl-b"


def _kubeconfig(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        f"clusters: [{{name: x, cluster: {{server: '{server}'}}}}]\n"
        "contexts: [{name: x, context: {cluster: x, user: x}}]\nusers: [{name: x, user: {}}]\n"
    )
    return path


def test_an_unreachable_api_exits_4_with_one_line(tmp_path: Path) -> None:
    done = run_corepin(
        "controller", "--kubeconfig", str(_kubeconfig(tmp_path, "http://127.0.0.1:1")),
        "--metrics-address", "127.0.0.1:0",
    )  # fmt: skip
    assert done.returncode == 4
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        "corepin controller: Kubernetes API server http://127.0.0.1:1 unreachable: "
    )


def test_missing_crds_exit_4_saying_what_to_install(fake_kubeconfig: Path) -> None:
    done = run_corepin(
        "controller", "--kubeconfig", str(fake_kubeconfig), "--metrics-address", "127.0.0.1:0"
    )
    assert done.returncode == 4
    assert done.stderr == (
        "corepin controller: the API server does not serve the CRD podcpubindings.corepin.io: "
        "install the CRDs first (kubectl apply -k deploy/crd)\n"
    )


def test_a_missing_kubeconfig_exits_4(tmp_path: Path) -> None:
    done = run_corepin("controller", "--kubeconfig", str(tmp_path / "nope"))
    assert done.returncode == 4
    assert len(done.stderr.strip().splitlines()) == 1
    assert str(tmp_path / "nope") in done.stderr


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (("--heartbeat-timeout", "0"), "expected a positive number of seconds, got '0'"),
        (("--heartbeat-timeout", "soon"), "expected a number of seconds, got 'soon'"),
        (("--metrics-address", "9465"), "bad address '9465': expected HOST:PORT"),
        (
            ("--lease-duration", "5", "--renew-deadline", "10"),
            "needs --lease-duration > --renew-deadline > --retry-period (got 5, 10, 2)",
        ),
        (("--identity", ""), "must not be empty"),
    ],
    ids=["zero timeout", "timeout not a number", "address without a colon", "lease timing",
         "empty identity"],
)  # fmt: skip
def test_bad_flags_exit_2_naming_the_value(
    tmp_path: Path, args: tuple[str, ...], text: str
) -> None:
    config = _kubeconfig(tmp_path, "http://127.0.0.1:1")
    done = run_corepin("controller", "--kubeconfig", str(config), *args)
    assert done.returncode == 2, done.stderr
    assert text in done.stderr


def test_help_lists_the_controller_and_its_flags() -> None:
    done = run_corepin("--help")
    assert "controller" in done.stdout
    done = run_corepin("controller", "--help")
    assert done.returncode == 0
    for flag in (
        "--kubeconfig", "--metrics-address", "--heartbeat-timeout", "--lease-namespace",
        "--lease-name", "--identity", "--lease-duration", "--renew-deadline", "--retry-period",
    ):  # fmt: skip
        assert flag in done.stdout
    assert "(default :9465)" in done.stdout
