"""The domain model every MCP Mesh part shares.

`mesh` depends on no other part. Contracts that two parts share (header names,
QoS classes, DSCP values, priority levels, error classes) are defined here once.
"""
