"""`corepin nri`: the node agent's decisions delivered through the container runtime's Node
Resource Interface, so a container gets its CPUs in the runtime's CreateContainer reply, before
its first instruction (`policy.py`; what the runtime reported: `view.py`; the wire:
`corepin.nri`)."""
