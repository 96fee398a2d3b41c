"""`corepin webhook` as a real process on a loopback port, for the tests that talk to it over
HTTPS (the webhook's own command-line tests and the admission end-to-end test)."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from typing import Any

from corepin.testing.fakeapi import TLSMaterial
from support.helpers import corepin_argv, wait_for
from support.ports import free_port


def clean_env() -> dict[str, str]:
    """This environment without a kubeconfig or an in-cluster account."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")
    }


class WebhookProcess:
    """`corepin webhook` serving HTTPS on a loopback port with the certificates of `tls` (and
    the `extra` flags), started and waited for until /healthz answers."""

    def __init__(self, tls: TLSMaterial, *extra: str) -> None:
        self.port = free_port()
        self.context = ssl.create_default_context(cafile=str(tls.ca.cert))
        self.proc = subprocess.Popen(
            corepin_argv(
                "webhook",
                "--address",
                f"127.0.0.1:{self.port}",
                "--tls-cert",
                str(tls.server.cert),
                "--tls-key",
                str(tls.server.key),
                *extra,
            ),
            env=clean_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_for(self.healthy, timeout=30, what="the webhook's /healthz")

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}{path}"

    def healthy(self) -> bool:
        assert self.proc.poll() is None, self.proc.communicate()
        try:
            with urllib.request.urlopen(self.url("/healthz"), context=self.context) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, ConnectionError, ssl.SSLError):
            return False

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            self.url(path),
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, context=self.context, timeout=10) as r:
            answer: dict[str, Any] = json.loads(r.read())
            return answer

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url("/metrics"), context=self.context) as r:
            text: str = r.read().decode()
            return text

    def terminate(self) -> tuple[int, float, str]:
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=10)
        return self.proc.returncode, time.monotonic() - started, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
