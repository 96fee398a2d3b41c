#!/bin/sh
# Install the Debian/Ubuntu packages corepin needs (uses sudo when not root).
#   sh scripts/install-deps.sh          make and Python's venv module (enough for `make demo`)
#   sh scripts/install-deps.sh --test   also containerd, runc and busybox-static, which the
#                                       real-container end-to-end tests run, prometheus,
#                                       which scrapes the metrics server in its test, and
#                                       qemu-system-x86 with linux-image-amd64, which the
#                                       virtual-machine tests boot (tests/vm; the qboot
#                                       firmware comes with qemu-system-data) (`make test`),
#                                       and fetches the NRI test bed (containerd 1.7 with NRI,
#                                       unpacked in a directory of its own, not installed:
#                                       scripts/fetch-containerd-nri.sh)
set -eu
packages="make"
python3 -c 'import ensurepip' 2>/dev/null || packages="$packages python3-venv"
if [ "${1:-}" = "--test" ]; then
    packages="$packages containerd runc busybox-static prometheus qemu-system-x86 linux-image-amd64"
fi
missing=""
for p in $packages; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# The NRI plugin's end-to-end tests run a containerd that has NRI (Debian 12's has not): it
# is fetched into a directory of its own, after the packages. Without it (no network) those
# tests are skipped, saying why.
fetch_testbed() {
    [ "${1:-}" = "--test" ] || return 0
    sh "$(dirname "$0")/fetch-containerd-nri.sh" ||
        echo "install-deps: no NRI test bed: the NRI end-to-end tests will be skipped" >&2
}
[ -n "$missing" ] || { echo "install-deps: nothing to install"; fetch_testbed "$@"; exit 0; }
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
# The kernel of linux-image-amd64 is booted only by the test guests, with an initramfs of their
# own: on a machine that does not boot from /boot (a container, a VM started with an outside
# kernel) the package's initramfs would be built for nothing (half a minute), so skip it there.
# A machine that boots Debian's kernels builds it as usual.
initrd=""
[ -e "/boot/vmlinuz-$(uname -r)" ] || initrd="INITRD=No"
echo "install-deps: installing$missing"
$sudo apt-get update -q
# shellcheck disable=SC2086
$sudo env DEBIAN_FRONTEND=noninteractive $initrd \
    apt-get install -y -q --no-install-recommends $missing
fetch_testbed "$@"
