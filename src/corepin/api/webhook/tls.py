"""The serving certificate of the webhook and the extender: loaded at start, reloaded when its
files (and the client CA's, when clients must present a certificate) change.

```python
cert = ServingCertificate("/etc/tls/tls.crt", "/etc/tls/tls.key")
cert.load()              # TLSFilesError (exit 4) naming the file that is wrong
# ServingCertificate(cert, key, client_ca="/etc/tls/ca.crt"): clients need a certificate
# that CA signed (mutual TLS)
ctx = cert.context()     # per new connection: the newest good pair (a stat of both files,
                         # at most every `check_interval` seconds)
```

Rotation without a restart: cert-manager renews the Secret and the kubelet swaps the mounted
files (an atomic rename of the `..data` symlink), so a change shows in `os.stat` of either
file (inode, size, mtime). A changed pair that does not load (a key written before its
certificate, say) is logged and the last good pair stays in use; it is tried again when the
files change again. Connections already open keep the context they started with.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from typing import Final

from corepin.core.errors import EnvironmentProblem

log = logging.getLogger("corepin.api.webhook.tls")

#: Seconds between two looks at the files.
CHECK_INTERVAL: Final = 1.0

Signature = tuple[tuple[int, int, int, int], ...]


class TLSFilesError(EnvironmentProblem):
    """The certificate or key file cannot be used; names the file and why."""

    default_reason = "tls_files"

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


def _read(path: str, what: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
    except OSError as exc:
        raise TLSFilesError(path, f"cannot read the TLS {what}: {exc.strerror or exc}") from None
    return data.decode("ascii", "replace")


def build_context(cert_file: str, key_file: str, client_ca: str | None = None) -> ssl.SSLContext:
    """A server-side TLS context (TLS >= 1.2, HTTP/1.1 by ALPN) for the pair; with `client_ca`
    (a PEM bundle) every client must present a certificate that it signed. TLSFilesError
    naming the file at fault."""
    cert_text = _read(cert_file, "certificate")
    if "-----BEGIN CERTIFICATE-----" not in cert_text:
        raise TLSFilesError(cert_file, "no PEM certificate in it (-----BEGIN CERTIFICATE-----)")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=cert_text)
    except (ssl.SSLError, ValueError) as exc:
        raise TLSFilesError(cert_file, f"not a valid PEM certificate ({_why(exc)})") from None
    key_text = _read(key_file, "key")
    if "PRIVATE KEY-----" not in key_text:
        raise TLSFilesError(key_file, "no PEM private key in it (-----BEGIN ... PRIVATE KEY-----)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["http/1.1"])
    try:
        context.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TLSFilesError(
                key_file, f"this key does not belong to the certificate {cert_file}"
            ) from None
        raise TLSFilesError(key_file, f"not a usable private key ({_why(exc)})") from None
    except OSError as exc:
        raise TLSFilesError(cert_file, f"cannot load: {exc.strerror or exc}") from None
    if client_ca is not None:
        ca_text = _read(client_ca, "client CA")
        if "-----BEGIN CERTIFICATE-----" not in ca_text:
            raise TLSFilesError(client_ca, "no PEM certificate in it (-----BEGIN CERTIFICATE-----)")
        try:
            context.load_verify_locations(cadata=ca_text)
        except (ssl.SSLError, ValueError) as exc:
            raise TLSFilesError(client_ca, f"not a valid PEM certificate ({_why(exc)})") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _why(exc: Exception) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason or exc)


class ServingCertificate:
    """The current TLS context of a certificate and key pair (see the module docstring)."""

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        *,
        client_ca: str | None = None,
        check_interval: float = CHECK_INTERVAL,
        on_reload: Callable[[bool], None] | None = None,
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca = client_ca
        self.check_interval = check_interval
        self.on_reload = on_reload
        self.reloads = 0
        self.failures = 0
        self.last_error = ""
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None
        self._loaded: Signature = ()
        self._failed: Signature = ()
        self._next_check = 0.0

    def _signature(self) -> Signature:
        out = []
        for path in (self.cert_file, self.key_file, self.client_ca or ""):
            if not path:
                continue
            try:
                st = os.stat(path)
            except OSError:
                out.append((0, 0, 0, 0))
                continue
            out.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(out)

    def load(self) -> ssl.SSLContext:
        """Load the pair now (TLSFilesError when it cannot be used)."""
        signature = self._signature()
        context = build_context(self.cert_file, self.key_file, self.client_ca)
        with self._lock:
            self._context, self._loaded, self._failed = context, signature, ()
            self._next_check = time.monotonic() + self.check_interval
        return context

    def context(self) -> ssl.SSLContext:
        """The newest good context (loads the pair on first use)."""
        if self._context is None:
            return self.load()
        now = time.monotonic()
        if now < self._next_check:
            return self._context
        with self._lock:
            if now < self._next_check:
                return self._context
            self._next_check = now + self.check_interval
            signature = self._signature()
            if signature in (self._loaded, self._failed):
                return self._context
            try:
                context = build_context(self.cert_file, self.key_file, self.client_ca)
            except TLSFilesError as exc:
                self._failed = signature
                self.failures += 1
                self.last_error = str(exc)
                log.warning("event=tls_reload_failed error=%s (serving the previous pair)", exc)
                self._notify(False)
                return self._context
            self._context, self._loaded, self._failed = context, signature, ()
            self.reloads += 1
            self.last_error = ""
            log.info("event=tls_reloaded cert=%s", self.cert_file)
            self._notify(True)
            return context

    def _notify(self, ok: bool) -> None:
        if self.on_reload is not None:
            try:
                self.on_reload(ok)
            except Exception:
                log.exception("event=tls_reload_hook_failed")
