"""Validator for the project's L7SchedulingPolicy (scheduling.mcp-mesh.io/v1alpha1).

The batching rules are mesh.batching_policy's (the same code the backend applies the policy
with), so `mcpctl validate` and `mcpctl serve --policy-file` cannot disagree; the routing
fields' (priority, matchHeaders, backendService) are mesh.l7_routing's, the shipped
ValidatingAdmissionPolicy's rules (a test runs both on the same objects).
"""
from __future__ import annotations

from typing import Iterator

from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.mesh.diagnostics import Diagnostic
from mcp26.mesh.batching_policy import API_VERSION, KIND, parse_spec
from mcp26.mesh.l7_routing import parse_routing
from mcp26.mesh.validation import validator


@validator(KIND)
def validate_scheduling_policy(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    if res.api_version != API_VERSION:
        yield res.diagnostic("apiVersion", f"{KIND} is served at {API_VERSION!r}, not {res.api_version!r}")
    _, problems = parse_spec(res.spec)
    _, routing = parse_routing(res.spec)
    for field, message in problems + routing:
        yield res.diagnostic(field, message)
