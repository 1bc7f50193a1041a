"""The mesh CA, node tokens and per-node SDS secrets (no sockets)."""
from __future__ import annotations

import datetime as dt
import os
import stat

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2

from mcp26.xds.ca import CAError, MeshCA, node_token_from_dir, self_signed_root
from mcp26.xds.cache import PreparedSnapshot
from mcp26.xds.model.node import ProxyNode
from mcp26.xds.sds import IdentityService
from mcp26.xds.model.type_urls import CLUSTER, SECRET

NODE = "sidecar~127.0.0.1~a-1.shop~shop.svc.cluster.local"


def _node(ca_dir, node_id=NODE, sa="a", token=None, labels=None):
    tok = node_token_from_dir(ca_dir, node_id, "shop", sa) if token is None else token
    return ProxyNode(id=node_id, namespace="shop", kind="sidecar", labels=labels or {}, service_account=sa,
                     identity_token=tok)


def test_root_created_0600_and_kept_across_restarts(tmp_path):
    d = str(tmp_path / "ca")
    first = MeshCA.load_or_create(d)
    for name in os.listdir(d):
        assert stat.S_IMODE(os.stat(os.path.join(d, name)).st_mode) == 0o600, name
    again = MeshCA.load_or_create(d)
    assert again.root_pem() == first.root_pem()
    assert again.token_key == first.token_key
    # a certificate issued before the restart still verifies under the reloaded root
    leaf = x509.load_pem_x509_certificates(first.issue("shop", "a").cert_chain_pem)[0]
    leaf.verify_directly_issued_by(again.root)


def test_svid_shape(tmp_path):
    ca = MeshCA.load_or_create(str(tmp_path))
    now = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
    issued = ca.issue("shop", "reviews", ttl=3600, now=now)
    leaf = x509.load_pem_x509_certificates(issued.cert_chain_pem)[0]
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert sans.critical
    assert [str(u.value) for u in sans.value] == ["spiffe://cluster.local/ns/shop/sa/reviews"]
    eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert not leaf.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert leaf.not_valid_after_utc == now + dt.timedelta(hours=1)
    leaf.verify_directly_issued_by(ca.root)


def test_plugged_in_ca_chain(tmp_path):
    from cryptography.hazmat.primitives import serialization
    cert, key = self_signed_root("corp.example", org="Corp")
    (tmp_path / "c.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "k.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()))
    ca = MeshCA.load_or_create(str(tmp_path / "state"), "corp.example", str(tmp_path / "c.pem"), str(tmp_path / "k.pem"))
    assert ca.plugged and ca.root.subject == cert.subject
    leaf = x509.load_pem_x509_certificates(ca.issue("shop", "a").cert_chain_pem)[0]
    leaf.verify_directly_issued_by(cert)
    other, _ = self_signed_root("x")
    (tmp_path / "c2.pem").write_bytes(other.public_bytes(serialization.Encoding.PEM))
    with pytest.raises(CAError, match="is not the key"):
        MeshCA.load_or_create(str(tmp_path / "state"), "x", str(tmp_path / "c2.pem"), str(tmp_path / "k.pem"))


def test_token_names_node_namespace_and_service_account(tmp_path):
    ca = MeshCA.load_or_create(str(tmp_path))
    tok = ca.node_token(NODE, "shop", "a")
    assert ca.check_token(tok, NODE, "shop", "a")
    assert not ca.check_token(tok, NODE, "shop", "b")
    assert not ca.check_token(tok, NODE.replace("a-1", "a-2"), "shop", "a")
    assert not ca.check_token("", NODE, "shop", "a")


def _base():
    return PreparedSnapshot.from_snapshot({CLUSTER: {}}, "g1")


def _secret(snap, name):
    found = snap.select(SECRET, [name])
    if not found:
        return None
    out = secret_pb2.Secret()
    found[0].any.Unpack(out)
    return out


def test_each_node_gets_its_own_key_and_a_bad_token_none(tmp_path):
    ca = MeshCA.load_or_create(str(tmp_path))
    ids = IdentityService(ca, 3600)
    base = _base()
    a1 = ids.overlay(_node(str(tmp_path)), base)
    a2 = ids.overlay(_node(str(tmp_path), NODE.replace("a-1", "a-2")), base)
    k1, k2 = _secret(a1, "default"), _secret(a2, "default")
    assert k1.tls_certificate.private_key.inline_bytes != k2.tls_certificate.private_key.inline_bytes
    assert _secret(a1, "ROOTCA").validation_context.trusted_ca.inline_bytes == ca.root_pem()
    forged = _node(str(tmp_path), NODE.replace("a-1", "evil"), sa="a", token=ca.node_token(NODE, "shop", "a"))
    snap = ids.overlay(forged, base)
    assert _secret(snap, "default") is None and _secret(snap, "ROOTCA") is not None
    assert "does not name" in ids.debug_certs()["nodes"][forged.id]["refused"]
    # the same node asking again gets the same (memoized) snapshot and certificate
    assert ids.overlay(_node(str(tmp_path)), base) is a1


def test_rotation_at_half_life(tmp_path):
    ca = MeshCA.load_or_create(str(tmp_path))
    now = [dt.datetime.now(dt.timezone.utc)]
    ids = IdentityService(ca, 600, clock=lambda: now[0])
    node = _node(str(tmp_path))
    first = _secret(ids.overlay(node, _base()), "default")
    now[0] += dt.timedelta(seconds=200)          # 1 minute of backdating + 200 s < half of 660 s
    assert ids.rotate_due([node]) == []
    now[0] += dt.timedelta(seconds=140)
    assert ids.rotate_due([node]) == [node.id]
    second = _secret(ids.overlay(node, _base()), "default")
    assert second.tls_certificate.certificate_chain.inline_bytes != first.tls_certificate.certificate_chain.inline_bytes


def test_debug_certs_has_no_key_material(tmp_path):
    ca = MeshCA.load_or_create(str(tmp_path))
    ids = IdentityService(ca, 3600)
    ids.overlay(_node(str(tmp_path)), _base())
    text = repr(ids.debug_certs())
    assert "spiffe://cluster.local/ns/shop/sa/a" in text and "PRIVATE" not in text and "BEGIN" not in text
