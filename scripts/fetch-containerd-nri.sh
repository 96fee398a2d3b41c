#!/bin/sh
# Fetch the NRI test bed: a containerd with NRI (Debian 13's containerd 1.7) and the CRI API's
# .proto, unpacked into a directory of their own; nothing is installed on the system and the
# system's apt sources are not touched (a private apt configuration reads Debian 13's index).
#   sh scripts/fetch-containerd-nri.sh        fetch into $COREPIN_TESTBED, by default
#                                             ~/.cache/corepin/testbed (skipped when present)
# The NRI end-to-end tests (tests/support/cri_harness.py) look there and skip, saying why,
# when the bed is absent. Exit 0 when the bed is there afterwards, 1 when it could not be
# fetched (no network, say): the message says what failed.
set -eu
bed=${COREPIN_TESTBED:-${HOME:-/root}/.cache/corepin/testbed}
dest="$bed/containerd-1.7"
stamp="$dest/.complete"
suite=trixie
packages="containerd golang-github-kubernetes-cri-api-dev"

if [ -f "$stamp" ]; then
    echo "fetch-containerd-nri: test bed present in $dest ($(head -n 1 "$stamp"))"
    exit 0
fi
for tool in apt-get dpkg-deb; do
    command -v "$tool" > /dev/null || {
        echo "fetch-containerd-nri: $tool not found: the test bed needs a Debian-like system" >&2
        exit 1
    }
done

mkdir -p "$bed"
work=$(mktemp -d "$bed/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
mkdir -p "$work/etc" "$work/lists/partial" "$work/cache/archives/partial" "$work/debs" \
    "$work/tree"
echo "deb http://deb.debian.org/debian $suite main" > "$work/etc/sources.list"
# apt with its own sources, lists and cache (the system's are neither read nor changed); as root
# it would hand the download to the _apt user, who cannot write into this private directory
apt_private() {
    apt-get -q \
        -o Dir::Etc::SourceList="$work/etc/sources.list" \
        -o Dir::Etc::SourceParts=/dev/null \
        -o Dir::State::Lists="$work/lists" \
        -o Dir::Cache="$work/cache" \
        -o APT::Get::List-Cleanup=0 \
        -o APT::Sandbox::User="$(id -un)" \
        "$@"
}

echo "fetch-containerd-nri: reading Debian $suite's package index"
if ! apt_private --error-on=any update > "$work/apt.log" 2>&1; then
    echo "fetch-containerd-nri: could not read Debian $suite's index (no network?):" >&2
    tail -n 5 "$work/apt.log" >&2
    exit 1
fi
# (package/suite: Debian 13's, never the installed version of the same name)
# shellcheck disable=SC2046
if ! (cd "$work/debs" && apt_private download $(printf "%s/$suite " $packages)) \
    > "$work/apt.log" 2>&1; then
    echo "fetch-containerd-nri: could not download $packages:" >&2
    tail -n 5 "$work/apt.log" >&2
    exit 1
fi
for deb in "$work"/debs/*.deb; do
    dpkg-deb -x "$deb" "$work/tree"
done
# the v1 shims are not used (the CRI runs the runc v2 shim): 20 MB less on disk
rm -f "$work/tree/usr/bin/containerd-shim" "$work/tree/usr/bin/containerd-shim-runc-v1"
versions=$(for deb in "$work"/debs/*.deb; do
    printf '%s=%s\n' "$(dpkg-deb -f "$deb" Package)" "$(dpkg-deb -f "$deb" Version)"
done | paste -sd' ' -)
containerd="$work/tree/usr/bin/containerd"
proto="$work/tree/usr/share/gocode/src/k8s.io/cri-api/pkg/apis/runtime/v1/api.proto"
for f in "$containerd" "$work/tree/usr/bin/containerd-shim-runc-v2" "$work/tree/usr/bin/ctr" \
    "$proto"; do
    [ -e "$f" ] || { echo "fetch-containerd-nri: $f is not in the packages" >&2; exit 1; }
done
if ! "$containerd" --version > "$work/version" 2>&1; then
    echo "fetch-containerd-nri: the fetched containerd does not run here:" >&2
    cat "$work/version" >&2
    exit 1
fi
printf '%s\n%s\n' "$versions" "$(cat "$work/version")" > "$work/tree/.complete"
rm -rf "$dest"
mv "$work/tree" "$dest"
echo "fetch-containerd-nri: test bed fetched into $dest ($versions)"
