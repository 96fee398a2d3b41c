"""CPUs near a device: from device names to the CPUs a request should run on, and the decision
every policy makes for a request that carries them (`Request.near`).

`near_cpus` resolves what a user names (`corepin run --near DEVICE`, `corepin allocate --near`)
against the machine's PCI devices (`Topology.devices`): each device's `local_cpus`, else the CPUs
of its NUMA node, else (the firmware knows no locality) every CPU - no CPU is nearer than
another then. A name the machine does not know is an InputError (exit 2) naming it and listing
some of the devices it has.

`decide_near` is how a policy honours `Request.near`: the same policy decides the request
without it, first out of the available CPUs inside `near` (when they hold the count), then -
unless `near_strict` - out of every available CPU. A strict request that does not fit inside
`near` is an AllocationError (exit 3, reason `near_unsatisfiable`). The first step of the
decision's explanation says which it was.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from corepin.allocation.types import Decision, Policy, Request, Step
from corepin.core.cpuset import CPUSet
from corepin.core.errors import AllocationError, InputError
from corepin.core.record import replace
from corepin.topology.devices import Device, find_device
from corepin.topology.model import Topology

#: How many of the machine's devices an unknown name's message lists.
_LISTED: Final = 6


def device_cpus(topology: Topology, device: Device) -> CPUSet:
    """The CPUs near `device` on `topology` (see the module docstring)."""
    if device.local_cpus:
        near = device.local_cpus & topology.present_cpus
        if near:
            return near
    if device.numa is not None and device.numa in topology.numa_node_ids():
        return topology.cpus_in_numa_nodes(device.numa)
    return topology.present_cpus


def describe_devices(devices: Iterable[Device]) -> str:
    """A short list of devices for a message: `0000:3b:00.0 (gpu nvidia0), ...`."""
    found = list(devices)
    if not found:
        return "none: no PCI devices are known here (no /sys/bus/pci, or none in the topology)"
    shown = []
    for device in found[:_LISTED]:
        names = " ".join(device.names[:2])
        shown.append(f"{device.address} ({device.kind}{' ' + names if names else ''})")
    more = len(found) - _LISTED
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def find_devices(topology: Topology, names: Iterable[str]) -> tuple[Device, ...]:
    """The devices `names` mean, in order; InputError naming the first the machine lacks."""
    out = []
    for name in names:
        device = find_device(topology.devices, name)
        if device is None:
            raise InputError(
                f"no device {name!r} on this machine (a PCI address, a network interface, a "
                f"block device or a /dev node); devices: {describe_devices(topology.devices)}",
                reason="unknown_device",
            )
        out.append(device)
    return tuple(out)


def near_cpus(topology: Topology, names: Iterable[str]) -> CPUSet:
    """The CPUs near every device in `names` together (their union); InputError (exit 2)
    naming a device the machine does not have, or when `names` is empty."""
    devices = find_devices(topology, names)
    if not devices:
        raise InputError("no device named to run near", reason="unknown_device")
    near = CPUSet()
    for device in devices:
        near |= device_cpus(topology, device)
    return near


def decide_near(
    policy: Policy, topology: Topology, request: Request, available: CPUSet
) -> Decision:
    """`policy`'s decision for `request` honouring `request.near` (see the module docstring).
    A request without `near` is decided as it is."""
    near = request.near
    if near is None:
        return policy.decide(topology, request, available)
    plain = replace(request, near=None, near_strict=False)
    inside = available & near
    n = request.count
    problem: AllocationError | None = None
    if len(inside) >= n:
        try:
            d = policy.decide(topology, plain, inside)
        except AllocationError as exc:
            problem = exc
        else:
            why = f"{len(inside)} available CPUs near the device(s) hold {n}"
            return _with_step(d, Step("near", str(near), why))
    short = (
        f"{problem.message}"
        if problem is not None
        else f"only {len(inside)} of them are available ({inside or 'none'})"
    )
    if request.near_strict:
        raise AllocationError(
            f"cannot place {n} CPUs near the device(s) (strict: CPUs {near} only): {short}",
            reason="near_unsatisfiable",
        )
    d = policy.decide(topology, plain, available)
    outside = d.cpus - near
    why = f"not enough near the device(s) ({short}): {len(outside)} CPU(s) taken outside"
    return _with_step(d, Step("near", f"{near} preferred", why))


def _with_step(d: Decision, step: Step) -> Decision:
    return Decision(d.cpus, d.mems, d.withheld, d.policy, (step, *d.explanation))
