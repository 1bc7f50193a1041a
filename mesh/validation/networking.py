"""Validators for networking.istio.io kinds, following istio/istio pkg/config/validation."""
from __future__ import annotations

from typing import Iterator

from mesh.config import MeshConfig, Resource
from mesh.errors import Diagnostic
from mesh.validation import validator

NETWORKING_VERSIONS = ("networking.istio.io/v1", "networking.istio.io/v1beta1", "networking.istio.io/v1alpha3")
NETWORKING_KINDS = ("Gateway", "VirtualService", "DestinationRule", "ServiceEntry", "WorkloadEntry")


def check_api_version(res: Resource, versions=NETWORKING_VERSIONS) -> Iterator[Diagnostic]:
    if res.api_version not in versions:
        yield res.diagnostic("apiVersion", f"{res.kind} is not served at {res.api_version!r}; "
                                           f"expected one of {', '.join(versions)}")


@validator(*NETWORKING_KINDS)
def validate_api_version(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    yield from check_api_version(res)
