"""The mesh CA: a root, workload X.509 SVIDs, and the node-bootstrap tokens.

As istiod's built-in CA (security/pkg/pki/ca): a self-signed root generated at
first start into a state directory (`--ca-dir`, files 0600), or an operator's
root/intermediate (`--ca-cert/--ca-key`, Istio's "plugged-in" CA). Workload
certificates carry one URI SAN, the SPIFFE id
`spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/SERVICE_ACCOUNT`, an empty subject (as
Istio's), key usages digitalSignature + keyEncipherment, extended key usages
serverAuth + clientAuth, and a short lifetime (24 h by default).

Keys are ECDSA P-256 (Istio's ECC option; RSA 2048 is its default): a key per
workload costs ~0.1 ms instead of ~50 ms, which matters when a rotation
reissues every proxy's certificate at once.

Node tokens: the CA dir also holds a 32-byte HMAC key. A token is
HMAC-SHA256(key, "mcp-mesh-node-v1" NUL node id NUL namespace NUL service
account), base64url; `mcpctl envoy bootstrap --ca-dir DIR` computes it into
node metadata, and the control plane issues an SVID only to a node whose
token names exactly its id, namespace and service account (see sds.py).
"""
from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_TRUST_DOMAIN = "cluster.local"
DEFAULT_WORKLOAD_TTL = 24 * 3600.0       # istiod's DEFAULT_WORKLOAD_CERT_TTL
ROOT_TTL = 10 * 365 * 24 * 3600.0        # istiod's self-signed root: 10 years
ROOT_CERT, ROOT_KEY, TOKEN_KEY = "root-cert.pem", "root-key.pem", "node-token.key"
# Backdate NotBefore a little, as Istio does, so that a clock a bit behind still accepts it.
CLOCK_SKEW = dt.timedelta(minutes=1)
TOKEN_CONTEXT = b"mcp-mesh-node-v1"


class CAError(Exception):
    """The CA cannot be loaded or created (a missing or unreadable file, a key that does not match)."""


def spiffe_id(trust_domain: str, namespace: str, service_account: str) -> str:
    return f"spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}"


@dataclass(frozen=True)
class IssuedCert:
    """One workload certificate: PEM chain (leaf, then the CA's chain up to the root)
    and key, with what /debug/certs shows."""
    cert_chain_pem: bytes
    key_pem: bytes
    spiffe_id: str
    serial: int
    not_before: dt.datetime
    not_after: dt.datetime

    @property
    def lifetime(self) -> float:
        return (self.not_after - self.not_before).total_seconds()


def _write_private(path: str, data: bytes) -> None:
    """Create `path` 0600 (never readable by others, even for a moment)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise CAError(f"cannot read {path}: {e.strerror}") from None


class MeshCA:
    """Signs workload certificates with `key` under `cert` (the root, or a plugged-in intermediate)."""

    def __init__(self, cert: x509.Certificate, key, chain: list[x509.Certificate], token_key: bytes,
                 trust_domain: str = DEFAULT_TRUST_DOMAIN, plugged: bool = False):
        self.cert, self.key, self.chain = cert, key, chain     # chain: cert's issuers up to the root
        self.token_key = token_key
        self.trust_domain = trust_domain
        self.plugged = plugged

    # -- loading ------------------------------------------------------------------
    @classmethod
    def load_or_create(cls, ca_dir: str, trust_domain: str = DEFAULT_TRUST_DOMAIN,
                       ca_cert: str = "", ca_key: str = "") -> "MeshCA":
        """The CA of `ca_dir`: created there at first start, read back at every later one
        (so a restart keeps the root and every certificate it signed stays valid)."""
        os.makedirs(ca_dir, mode=0o700, exist_ok=True)
        token_path = os.path.join(ca_dir, TOKEN_KEY)
        if not os.path.exists(token_path):
            _write_private(token_path, secrets.token_bytes(32))
        token_key = _read(token_path)
        if ca_cert or ca_key:
            if not (ca_cert and ca_key):
                raise CAError("--ca-cert and --ca-key go together")
            return cls._plugged(ca_cert, ca_key, token_key, trust_domain)
        cert_path, key_path = os.path.join(ca_dir, ROOT_CERT), os.path.join(ca_dir, ROOT_KEY)
        if not os.path.exists(cert_path) and not os.path.exists(key_path):
            cert, key = self_signed_root(trust_domain)
            _write_private(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
            _write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM))
        return cls._plugged(cert_path, key_path, token_key, trust_domain, plugged=False)

    @classmethod
    def _plugged(cls, cert_path: str, key_path: str, token_key: bytes, trust_domain: str,
                 plugged: bool = True) -> "MeshCA":
        try:
            certs = x509.load_pem_x509_certificates(_read(cert_path))
        except ValueError as e:
            raise CAError(f"{cert_path}: not a PEM certificate: {e}") from None
        try:
            key = serialization.load_pem_private_key(_read(key_path), password=None)
        except (ValueError, TypeError) as e:
            raise CAError(f"{key_path}: not an unencrypted PEM private key: {e}") from None
        if certs[0].public_key().public_numbers() != key.public_key().public_numbers():
            raise CAError(f"{key_path} is not the key of the first certificate in {cert_path}")
        return cls(certs[0], key, certs[1:], token_key, trust_domain, plugged)

    # -- what SDS serves ----------------------------------------------------------
    @property
    def root(self) -> x509.Certificate:
        """The trust anchor: the last of a plugged-in chain, else our own root."""
        return self.chain[-1] if self.chain else self.cert

    def root_pem(self) -> bytes:
        return self.root.public_bytes(serialization.Encoding.PEM)

    def issue(self, namespace: str, service_account: str, ttl: float = DEFAULT_WORKLOAD_TTL,
              now: dt.datetime | None = None) -> IssuedCert:
        """A fresh key and an SVID for ns/sa."""
        now = now or dt.datetime.now(dt.timezone.utc)
        ident = spiffe_id(self.trust_domain, namespace, service_account)
        key = ec.generate_private_key(ec.SECP256R1())
        serial = x509.random_serial_number()
        not_before = now - min(CLOCK_SKEW, dt.timedelta(seconds=ttl / 10))   # short test lifetimes stay short
        not_after = min(now + dt.timedelta(seconds=ttl), self.cert.not_valid_after_utc)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([]))
                .issuer_name(self.cert.subject)
                .public_key(key.public_key())
                .serial_number(serial)
                .not_valid_before(not_before)
                .not_valid_after(not_after)
                .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(ident)]), critical=True)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=True, content_commitment=False,
                                             data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                             crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.cert.public_key()),
                               critical=False)
                .sign(self.key, hashes.SHA256()))
        chain = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in [cert, *self._chain_to_send()])
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        return IssuedCert(chain, key_pem, ident, serial, not_before, not_after)

    def issue_server(self, hosts: list[str], ttl: float = 365 * 86400) -> tuple[bytes, bytes]:
        """(chain PEM, key PEM) of a serving certificate for `hosts` (DNS names and IPs): the control
        plane's own, for the admission webhook and ADS over TLS (istiod's `istiod.NS.svc`)."""
        import ipaddress
        now = dt.datetime.now(dt.timezone.utc)
        key = ec.generate_private_key(ec.SECP256R1())
        names = []
        for h in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                names.append(x509.DNSName(h))
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0][:64])]))
                .issuer_name(self.cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - CLOCK_SKEW)
                .not_valid_after(min(now + dt.timedelta(seconds=ttl), self.cert.not_valid_after_utc))
                .add_extension(x509.SubjectAlternativeName(names), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self.cert.public_key()),
                               critical=False)
                .sign(self.key, hashes.SHA256()))
        chain = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in [cert, *self._chain_to_send()])
        return chain, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption())

    def _chain_to_send(self) -> list[x509.Certificate]:
        """What follows the leaf: a plugged-in intermediate (and its issuers below the root)."""
        return [self.cert, *self.chain[:-1]] if self.chain else []

    # -- node tokens ----------------------------------------------------------------
    def node_token(self, node_id: str, namespace: str, service_account: str) -> str:
        return node_token(self.token_key, node_id, namespace, service_account)

    def check_token(self, token: str, node_id: str, namespace: str, service_account: str) -> bool:
        return bool(token) and hmac.compare_digest(token, self.node_token(node_id, namespace, service_account))


def node_token(key: bytes, node_id: str, namespace: str, service_account: str) -> str:
    msg = b"\0".join(s.encode() for s in (node_id, namespace, service_account))
    mac = hmac.new(key, TOKEN_CONTEXT + b"\0" + msg, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def node_token_from_dir(ca_dir: str, node_id: str, namespace: str, service_account: str) -> str:
    """What `mcpctl envoy bootstrap --ca-dir` writes: needs read access to the CA's token key."""
    return node_token(_read(os.path.join(ca_dir, TOKEN_KEY)), node_id, namespace, service_account)


def self_signed_root(trust_domain: str, ttl: float = ROOT_TTL, org: str = "") -> tuple:
    """A root as istiod makes one: O=<trust domain>, CA:TRUE, keyCertSign + cRLSign."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, org or trust_domain)])
    cert = (x509.CertificateBuilder()
            .subject_name(name).issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - CLOCK_SKEW)
            .not_valid_after(now + dt.timedelta(seconds=ttl))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, content_commitment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert, key


def describe(pem: bytes) -> list[dict]:
    """Subject, SANs, validity and serial of each certificate in a PEM chain -- never a key."""
    out = []
    for c in x509.load_pem_x509_certificates(pem):
        try:
            sans = [str(g.value) for g in c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value]
        except x509.ExtensionNotFound:
            sans = []
        out.append({"subject": c.subject.rfc4514_string(), "issuer": c.issuer.rfc4514_string(),
                    "san": sans, "serial": format(c.serial_number, "x"),
                    "not_before": c.not_valid_before_utc.isoformat(),
                    "not_after": c.not_valid_after_utc.isoformat(),
                    "sha256": c.fingerprint(hashes.SHA256()).hex()})
    return out
