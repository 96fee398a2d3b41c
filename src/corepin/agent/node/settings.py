"""Settings of the Kubernetes node agent (`corepin agent`).

The CLI builds one `NodeSettings` from its flags and the environment (`NODE_NAME` stands for
`--node-name`, `POD_NAMESPACE` names the agent's namespace, where the `corepin-qos` ConfigMap
lives); nothing below the agent reads the environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from corepin.agent.settings import DEFAULT_RESCTRL_ROOT, AgentSettings
from corepin.core.cpuset import CPUSet
from corepin.core.errors import InputError
from corepin.core.ids import validate_component
from corepin.core.record import field, record

DEFAULT_KUBELET_STATE: Final = "/var/lib/kubelet/cpu_manager_state"
DEFAULT_GRPC_SOCKET: Final = "/run/corepin/corepin.sock"
DEFAULT_METRICS_ADDRESS: Final = ":9464"
DEFAULT_ASSIGNMENT_DIR: Final = "/run/corepin/assignments"
CGROUP_DRIVERS: Final = ("auto", "cgroupfs", "systemd")
#: the kubelet's PodResources API (the devices of each container, their NUMA nodes)
DEFAULT_POD_RESOURCES_SOCKET: Final = "/var/lib/kubelet/pod-resources/kubelet.sock"
#: the ConfigMap (in the agent's namespace) whose key `qos.yaml` is the node QoS policy
QOS_CONFIGMAP: Final = "corepin-qos"
QOS_CONFIGMAP_KEY: Final = "qos.yaml"
#: `--rebalance` modes (`corepin.agent.node.rebalance`)
REBALANCE_MODES: Final = ("off", "report", "move")


@record
class NodeSettings(AgentSettings):
    """Everything the node agent needs to know about where things are and what to do (the
    roots and policy of `AgentSettings`, and its own)."""

    node_name: str = field(kw_only=True)
    kubelet_cgroup_root: str = "/"
    cgroup_driver: str = "auto"
    options: Mapping[str, str] = field(default_factory=dict)
    reserved_cpus: CPUSet | None = None
    resync_period: float = 30.0
    heartbeat_period: float = 10.0
    kubelet_compat: bool = False
    kubelet_state: str = DEFAULT_KUBELET_STATE
    grpc_socket: str = DEFAULT_GRPC_SOCKET
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    #: one file per pinned container (the webhook mounts it at /etc/corepin);
    #: "" writes none
    assignment_dir: str = DEFAULT_ASSIGNMENT_DIR
    #: raise a shield over the whole cpuset hierarchy: everything outside the kubelet's pods
    #: (system daemons, the kubelet, the runtime) runs on the reserved CPUs and the shared pool
    shield_system: bool = False
    #: node QoS (`corepin.agent.node.qos`): the policy file (None: the default policy, unless
    #: the ConfigMap `corepin-qos` of `namespace` says otherwise), the resctrl mount, and the
    #: period of the QoS loop in seconds (0: no loop, classes are still published)
    qos_config: str | None = None
    resctrl_root: str = DEFAULT_RESCTRL_ROOT
    qos_period: float = 1.0
    #: the agent's namespace ("" : the QoS ConfigMap is not watched)
    namespace: str = ""
    #: the kubelet's PodResources socket: exclusive CPUs near each container's devices, the
    #: node's devices in its NodeCPUTopology ("": not read)
    pod_resources_socket: str = DEFAULT_POD_RESOURCES_SOCKET
    #: evict a pod whose exclusive CPUs a new reservation takes when no other CPUs fit it
    #: (else the reservation waits and the pod is told)
    evict_on_reservation: bool = False
    #: rebalancing (`corepin.agent.node.rebalance`): off, report (advise: an Event) or move
    #: (re-pin live), at most `rebalance_rate` moves per minute (0: none)
    rebalance: str = "report"
    rebalance_rate: int = 6

    def __post_init__(self) -> None:
        if not self.node_name:
            raise InputError(
                "the agent needs its node's name: pass --node-name NAME or set NODE_NAME",
                reason="missing_node_name",
            )
        validate_component(self.node_name, "node name")
        if self.cgroup_driver not in CGROUP_DRIVERS:
            raise InputError(
                f"unknown cgroup driver {self.cgroup_driver!r} (choose from "
                f"{', '.join(CGROUP_DRIVERS)})",
                reason="bad_cgroup_driver",
            )
        if not self.resync_period > 0 or not self.heartbeat_period > 0:
            raise InputError(
                f"periods must be positive seconds, got resync {self.resync_period!r} and "
                f"heartbeat {self.heartbeat_period!r}",
                reason="bad_period",
            )
        if not self.qos_period >= 0:
            raise InputError(
                f"--qos-period must be 0 (off) or positive seconds, got {self.qos_period!r}",
                reason="bad_period",
            )
        if self.namespace:
            validate_component(self.namespace, "namespace")
        if self.rebalance not in REBALANCE_MODES:
            raise InputError(
                f"unknown --rebalance mode {self.rebalance!r} (choose from "
                f"{', '.join(REBALANCE_MODES)})",
                reason="bad_rebalance",
            )
        rate = self.rebalance_rate
        if isinstance(rate, bool) or not isinstance(rate, int) or rate < 0:
            raise InputError(
                f"--rebalance-rate must be 0 or a positive number of moves per minute, got "
                f"{rate!r}",
                reason="bad_rebalance_rate",
            )
        self.check_state_dir()
