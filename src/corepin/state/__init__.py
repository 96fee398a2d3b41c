"""corepin state layer: what standalone host mode and the node agent persist.

- `model`: `Assignment`, `HostState` (immutable values, pure updates, pools derived by the one
  pool model `corepin.allocation.pools.NodePools`);
- `owners`: `ProcessOwner`, `ContainerOwner` (who an assignment belongs to);
- `checkpoint`: versioned, checksummed JSON checkpoint file, atomic writer;
- `payload`: what the checkpoint holds, `HostState` as JSON and back;
- `migrations`: older checkpoint versions brought up to the current one (loaded on demand);
- `store`: `StateStore` (state directory and its safety checks, transactions, quarantine);
- `lock`: the state lock (an flock granted in arrival order);
- `validate`: restored state against the live topology (repair or refuse);
- `adopt`: a restored state validated before anyone acts on it (`adopt`, `read_state`);
- `transaction`: the one state transaction of host mode and the node agent (adopted state);
- `kubelet`: import of the kubelet's cpu_manager_state (loaded on first use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from corepin.state.checkpoint import (
    decode_checkpoint,
    encode_checkpoint,
    read_checkpoint,
    write_checkpoint,
)
from corepin.state.model import STRICT_RESERVATION, Assignment, HostState, fingerprint
from corepin.state.owners import ContainerOwner, Owner, ProcessOwner
from corepin.state.payload import CURRENT_VERSION
from corepin.state.store import (
    DEFAULT_STATE_DIR,
    STATE_DIR_ENV,
    StateStore,
    Transaction,
    state_dir_from,
)
from corepin.state.validate import validate

if TYPE_CHECKING:
    from corepin.state.kubelet import (
        KubeletCheckpoint,
        kubelet_to_host_state,
        parse_kubelet_state,
        read_kubelet_state,
    )

__all__ = [
    "CURRENT_VERSION",
    "DEFAULT_STATE_DIR",
    "STATE_DIR_ENV",
    "STRICT_RESERVATION",
    "Assignment",
    "ContainerOwner",
    "HostState",
    "KubeletCheckpoint",
    "Owner",
    "ProcessOwner",
    "StateStore",
    "Transaction",
    "decode_checkpoint",
    "encode_checkpoint",
    "fingerprint",
    "kubelet_to_host_state",
    "parse_kubelet_state",
    "read_checkpoint",
    "read_kubelet_state",
    "state_dir_from",
    "validate",
    "write_checkpoint",
]

_KUBELET = (
    "KubeletCheckpoint",
    "kubelet_to_host_state",
    "parse_kubelet_state",
    "read_kubelet_state",
)


def __getattr__(name: str) -> object:
    if name in _KUBELET:
        from corepin.state import kubelet

        return getattr(kubelet, name)
    raise AttributeError(f"module 'corepin.state' has no attribute {name!r}")
