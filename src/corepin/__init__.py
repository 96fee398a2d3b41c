"""corepin: topology-aware CPU and NUMA resource manager.

The top-level API (CONTRACTS.md section 1): `CPUSet`, `Topology`, `discover`, `allocate`.
Heavier entry points load on first use so that `import corepin` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from corepin.core.cpuset import CPUSet
from corepin.core.errors import (
    AllocationError,
    CorepinError,
    EnvironmentProblem,
    InputError,
    SysfsError,
    TopologyError,
)
from corepin.topology.model import Topology

if TYPE_CHECKING:
    from corepin.allocation.api import allocate
    from corepin.topology.discover import discover

__version__ = "0.1.0"

__all__ = [
    "AllocationError",
    "CPUSet",
    "CorepinError",
    "EnvironmentProblem",
    "InputError",
    "SysfsError",
    "Topology",
    "TopologyError",
    "allocate",
    "discover",
]


def __getattr__(name: str) -> Any:
    if name == "discover":
        from corepin.topology.discover import discover

        return discover
    if name == "allocate":
        from corepin.allocation.api import allocate

        return allocate
    raise AttributeError(f"module 'corepin' has no attribute {name!r}")
