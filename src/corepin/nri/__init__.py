"""The Node Resource Interface (NRI) wire: how `corepin nri` talks to the container runtime.

No Python library speaks NRI or ttrpc, so this package frames the protocol itself over the
protobuf package corepin already depends on: `gen/` holds the messages generated from
`proto/nri/` at install time (setup.py).
"""
