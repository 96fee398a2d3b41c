"""The container image of the CRI test bed, built on the spot: no registry, no pull.

`busybox_image_tar` writes an OCI image layout (the archive `ctr images import` reads) of one
layer: the host's statically linked busybox as /bin/busybox, with links for the applets the
tests run. Its entrypoint sleeps for good, which makes it the pod sandbox's ("pause") image as
well; a container gives its own command. Everything in the archive is fixed (owner, mode, time),
so the same busybox always gives the same image digest.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import tarfile
from pathlib import Path
from typing import Any

#: the image's reference as the CRI names it (a `localhost/` name is never pulled)
IMAGE = "localhost/corepin/busybox:cri-bed"
#: busybox applets linked into /bin (what the tests' commands run)
APPLETS = (
    "sh",
    "sleep",
    "cat",
    "grep",
    "true",
    "false",
    "echo",
    "ls",
    "taskset",
    "nproc",
    "env",
    "head",
)
#: the entrypoint: sleep for good (the sandbox's pause process, or a container without command)
ENTRYPOINT = ["/bin/sleep", "2147483647"]

_GOARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le"}
_MEDIA = "application/vnd.oci.image"


def goarch() -> str:
    """This machine's architecture in the image's words (Go's names)."""
    machine = platform.machine()
    return _GOARCH.get(machine, machine)


def _member(name: str, kind: bytes, mode: int, *, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.size = size
    info.linkname = link
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def layer_tar(busybox: Path) -> bytes:
    """The image's only layer: directories, /bin/busybox and the applets' links."""
    out = io.BytesIO()
    payload = busybox.read_bytes()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("bin", "dev", "etc", "proc", "sys", "tmp"):
            tar.addfile(_member(d, tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755))
        tar.addfile(
            _member("bin/busybox", tarfile.REGTYPE, 0o755, size=len(payload)), io.BytesIO(payload)
        )
        for applet in APPLETS:
            tar.addfile(_member(f"bin/{applet}", tarfile.SYMTYPE, 0o777, link="busybox"))
    return out.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    tar.addfile(
        _member(f"blobs/sha256/{digest[7:]}", tarfile.REGTYPE, 0o644, size=len(data)),
        io.BytesIO(data),
    )
    return digest


def _json(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def busybox_image_tar(busybox: Path, dest: Path, *, name: str = IMAGE) -> Path:
    """Write the OCI image layout archive of the busybox image to `dest` (named `name` for
    `ctr images import`); `dest` back."""
    layer = layer_tar(busybox)
    layer_digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = _json(
        {
            "architecture": goarch(),
            "os": "linux",
            "config": {"Entrypoint": ENTRYPOINT, "Env": ["PATH=/bin"], "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
            "history": [{"created_by": "corepin tests: busybox-static with applet links"}],
        }
    )
    with tarfile.open(dest, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("blobs", "blobs/sha256"):
            tar.addfile(_member(d, tarfile.DIRTYPE, 0o755))
        config_digest = _blob(tar, config)
        _blob(tar, layer)
        manifest = _json(
            {
                "schemaVersion": 2,
                "mediaType": f"{_MEDIA}.manifest.v1+json",
                "config": {
                    "mediaType": f"{_MEDIA}.config.v1+json",
                    "digest": config_digest,
                    "size": len(config),
                },
                "layers": [
                    {
                        "mediaType": f"{_MEDIA}.layer.v1.tar",
                        "digest": layer_digest,
                        "size": len(layer),
                    }
                ],
            }
        )
        manifest_digest = _blob(tar, manifest)
        index = _json(
            {
                "schemaVersion": 2,
                "mediaType": f"{_MEDIA}.index.v1+json",
                "manifests": [
                    {
                        "mediaType": f"{_MEDIA}.manifest.v1+json",
                        "digest": manifest_digest,
                        "size": len(manifest),
                        "platform": {"architecture": goarch(), "os": "linux"},
                        "annotations": {
                            "io.containerd.image.name": name,
                            "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
                        },
                    }
                ],
            }
        )
        layout = _json({"imageLayoutVersion": "1.0.0"})
        for member, data in (("oci-layout", layout), ("index.json", index)):
            tar.addfile(_member(member, tarfile.REGTYPE, 0o644, size=len(data)), io.BytesIO(data))
    return dest
