"""Settings of the NRI plugin (`corepin nri`).

The CLI builds one `NriSettings` from its flags and the environment (`NODE_NAME` stands for
`--node-name`, else the host name); nothing below the plugin reads the environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from corepin.agent.settings import DEFAULT_RESCTRL_ROOT, AgentSettings
from corepin.core.cpuset import CPUSet
from corepin.core.errors import InputError
from corepin.core.ids import validate_component
from corepin.core.record import field, record
from corepin.nri.plugin import DEFAULT_SOCKET, check_index, check_name

DEFAULT_PLUGIN_NAME: Final = "corepin"
DEFAULT_PLUGIN_INDEX: Final = "10"
DEFAULT_METRICS_ADDRESS: Final = ":9464"


@record
class NriSettings(AgentSettings):
    """Where the runtime's NRI socket is, who the plugin is, and the node agent's roots and
    policy (`AgentSettings`)."""

    node_name: str = field(kw_only=True)
    socket: str = DEFAULT_SOCKET
    plugin_name: str = DEFAULT_PLUGIN_NAME
    plugin_index: str = DEFAULT_PLUGIN_INDEX
    options: Mapping[str, str] = field(default_factory=dict)
    reserved_cpus: CPUSet | None = None
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    #: node QoS in NRI mode: the policy file (None: the default policy) and where resctrl is
    #: mounted (its class groups are handed to the runtime as each container's RDT class)
    qos_config: str | None = None
    resctrl_root: str = DEFAULT_RESCTRL_ROOT

    def __post_init__(self) -> None:
        if not self.node_name:
            raise InputError(
                "the plugin needs its node's name: pass --node-name NAME or set NODE_NAME",
                reason="missing_node_name",
            )
        validate_component(self.node_name, "node name")
        check_name(self.plugin_name)
        check_index(self.plugin_index)
        if not self.socket:
            raise InputError("the NRI socket path must not be empty", reason="bad_nri_socket")
        self.check_state_dir()


__all__ = ["NriSettings"]
