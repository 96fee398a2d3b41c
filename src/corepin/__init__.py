"""corepin: topology-aware CPU and NUMA resource manager.

The top-level API: `CPUSet`, `Topology`, `discover`, `allocate`, and the errors they raise
(`CorepinError` and its kinds, each with the exit code the command line gives it:
`InputError` 2 with `RequestError`, `TopologyError` and `CPUSetParseError`, `AllocationError`
3, `EnvironmentProblem` 4 with `SysfsError`). This page names nothing that is not exported
here (a test checks it).
Every name loads on first use: `import corepin` (which `python -m corepin` and the console
script run before corepin's own Ctrl-C handling is in place) imports nothing.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing itself stays unloaded too
if TYPE_CHECKING:
    from typing import Any

    from corepin.allocation.api import allocate
    from corepin.core.cpuset import CPUSet
    from corepin.core.errors import (
        AllocationError,
        CorepinError,
        CPUSetParseError,
        EnvironmentProblem,
        InputError,
        RequestError,
        SysfsError,
        TopologyError,
    )
    from corepin.topology.discover import discover
    from corepin.topology.model import Topology

__version__ = "0.1.0"

#: Each public name and the module it lives in.
_HOMES = {
    "AllocationError": "corepin.core.errors",
    "CPUSet": "corepin.core.cpuset",
    "CPUSetParseError": "corepin.core.errors",
    "CorepinError": "corepin.core.errors",
    "EnvironmentProblem": "corepin.core.errors",
    "InputError": "corepin.core.errors",
    "RequestError": "corepin.core.errors",
    "SysfsError": "corepin.core.errors",
    "Topology": "corepin.topology.model",
    "TopologyError": "corepin.core.errors",
    "allocate": "corepin.allocation.api",
    "discover": "corepin.topology.discover",
}

__all__ = [
    "AllocationError",
    "CPUSet",
    "CPUSetParseError",
    "CorepinError",
    "EnvironmentProblem",
    "InputError",
    "RequestError",
    "SysfsError",
    "Topology",
    "TopologyError",
    "allocate",
    "discover",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'corepin' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
