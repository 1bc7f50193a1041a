"""The test hook's input: raw Envoy resources (JSON) to lay over every snapshot.

Used only to make a proxy NACK on purpose (a resource our validation would
never let through); enabled with `mcpctl xds serve --test-hooks`.
Body: {"resources": [{"type_url": ..., "name": ..., "resource": {Envoy JSON}}]}
(an empty list clears the overrides).
"""
from __future__ import annotations

from google.protobuf import json_format, symbol_database

import mcp26.xds.model.type_urls  # noqa: F401  (the Envoy protos are registered on import of their modules)


def _message_class(type_url: str):
    full_name = type_url.rsplit("/", 1)[-1]
    _ensure_imported(full_name)
    return symbol_database.Default().GetSymbol(full_name)


def _ensure_imported(full_name: str) -> None:
    # envoy.config.route.v3.RouteConfiguration -> envoy/config/route/v3/route_pb2 etc.
    import importlib
    package = full_name.rsplit(".", 1)[0]
    for mod in ("route_pb2", "listener_pb2", "cluster_pb2", "endpoint_pb2", "extension_pb2", "secret_pb2"):
        try:
            importlib.import_module(f"{package}.{mod}")
        except ImportError:
            pass


def parse_overrides(body: dict) -> dict:
    out: dict = {}
    for item in body.get("resources", []):
        cls = _message_class(item["type_url"])
        msg = json_format.ParseDict(item["resource"], cls())
        out.setdefault(item["type_url"], {})[item["name"]] = msg
    return out
