"""The Node Resource Interface (NRI) wire: how `corepin nri` talks to the container runtime.

No Python library speaks NRI or ttrpc, so this package frames the protocol itself over the
protobuf package corepin already depends on: `gen/` holds the messages generated from
`proto/nri/` at install time (setup.py).

- `ttrpc`: ttrpc frames (pure encoder and incremental decoder), the Request/Response envelope,
  the errors of the package (`NriError` and its kinds, all `EnvironmentProblem`s);
- `mux`: the multiplexer that carries the Plugin and Runtime services over one socket, with its
  reader thread;
- `connection`: one live connection (answers to the runtime, calls to it);
- `service`: the Plugin service: `Handlers` (what the plugin's logic implements), run in order
  on one dispatcher thread;
- `plugin`: `NriPlugin`, connecting, registering, serving and reconnecting.

The plugin's decisions (which CPUs a container gets) are not here: they are `corepin.agent`'s.
"""
