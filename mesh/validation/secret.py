"""Validator for Kubernetes Secrets (v1) of type kubernetes.io/tls: what a
Gateway's `credentialName` names. The data must decode (base64) to a PEM
certificate chain and a PEM private key that belongs to its first
certificate; `ca.crt`, when present, to PEM certificates."""
from __future__ import annotations

import base64
import binascii
from typing import Iterator

from mcp26.mesh.diagnostics import Diagnostic
from mcp26.mesh.resources import MeshConfig, Resource
from mcp26.mesh.validation import validator
from mcp26.mesh.validation.report import Report

TLS_TYPE = "kubernetes.io/tls"
FIELDS = {"type", "data", "stringData", "immutable"}
TLS_KEYS = {"tls.crt", "tls.key", "ca.crt"}


@validator("Secret")
def validate_secret(res: Resource, config: MeshConfig) -> Iterator[Diagnostic]:
    rep = Report(res)
    spec = res.spec
    if res.api_version != "v1":
        rep.error("apiVersion", f"Secret is served at v1, not {res.api_version!r}")
    for k in spec:
        if k not in FIELDS:
            rep.error(k, f"unknown field {k!r}; a Secret has {', '.join(sorted(FIELDS))}")
    kind = spec.get("type") or "Opaque"
    if kind != TLS_TYPE:
        rep.warn("type", f"only {TLS_TYPE} Secrets are used (by a Gateway's credentialName); this one "
                         f"({kind}) is ignored")
        yield from rep.out
        return
    data: dict[str, bytes] = {}
    for section in ("data", "stringData"):
        values = spec.get(section) or {}
        if not isinstance(values, dict):
            rep.error(section, f"{section} must be a mapping of key to value")
            continue
        for k, v in values.items():
            path = f"{section}.{k}"
            if k not in TLS_KEYS:
                rep.error(path, f"unknown key {k!r} in a {TLS_TYPE} Secret; expected {', '.join(sorted(TLS_KEYS))}")
                continue
            if section == "data":
                try:
                    data[k] = base64.b64decode(str(v), validate=True)
                except (binascii.Error, ValueError):
                    rep.error(path, "not valid base64")
                    continue
            else:
                data[k] = str(v).encode()
    for k in ("tls.crt", "tls.key"):
        if k not in data and not any(d.field.endswith(k) for d in rep.out):
            rep.error("data", f"a {TLS_TYPE} Secret needs data[{k!r}]")
    if not rep.out:
        _pem(rep, data)
    yield from rep.out


def _pem(rep: Report, data: dict) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    path = lambda k: ("data." if k in (rep.res.spec.get("data") or {}) else "stringData.") + k
    try:
        certs = x509.load_pem_x509_certificates(data["tls.crt"])
    except ValueError:
        rep.error(path("tls.crt"), "not a PEM certificate chain")
        return
    try:
        key = serialization.load_pem_private_key(data["tls.key"], password=None)
    except (ValueError, TypeError):
        rep.error(path("tls.key"), "not an unencrypted PEM private key")
        return
    if certs[0].public_key().public_numbers() != key.public_key().public_numbers():
        rep.error(path("tls.key"), "the key does not belong to the first certificate of tls.crt")
    if "ca.crt" in data:
        try:
            x509.load_pem_x509_certificates(data["ca.crt"])
        except ValueError:
            rep.error(path("ca.crt"), "not a PEM certificate bundle")
