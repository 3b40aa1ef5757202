"""Certificates and keys for a throwaway control plane (the `cryptography` package, ECDSA P-256).

- `ca`: signs the API server's serving certificate and every client certificate (the API server's
  `--client-ca-file`). The admin is CN=admin, O=system:masters.
- `front-proxy-ca`: the aggregation layer's `--requestheader-client-ca-file`; the API server
  presents `front-proxy-client` (signed by it) when it proxies to Kueue's visibility server.
- `sa.key` / `sa.pub`: the service-account token signing key pair.
- `apiserver-kubelet-client`: what the API server presents to the kubelet (logs, exec, port-forward);
  the kubelet's serving certificate is issued by `ca` too (tests/cluster/node.py).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, *, ca: bool
             ) -> x509.CertificateBuilder:
    """The fields every certificate here shares: a week's validity, and CA or leaf key usage."""
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
    )


@dataclass
class CA:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    cert_path: Path

    @classmethod
    def create(cls, directory: Path, name: str) -> CA:
        key = _key()
        subject = _name(name)
        cert = (
            _builder(subject, subject, key, ca=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        path = directory / f"{name}.crt"
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (directory / f"{name}.key").write_bytes(_key_pem(key))
        return cls(key, cert, path)

    def issue(
        self,
        directory: Path,
        name: str,
        cn: str,
        *,
        orgs: tuple[str, ...] = (),
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        server: bool = False,
        client: bool = False,
    ) -> tuple[Path, Path]:
        key = _key()
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            _builder(_name(cn, orgs), self.cert.subject, key, ca=False)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        crt, keyp = directory / f"{name}.crt", directory / f"{name}.key"
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        keyp.write_bytes(_key_pem(key))
        keyp.chmod(0o600)
        return crt, keyp


@dataclass
class Pki:
    dir: Path
    ca: CA
    front_proxy_ca: CA
    serving: tuple[Path, Path]
    admin: tuple[Path, Path]
    front_proxy_client: tuple[Path, Path]
    sa_key: Path
    sa_pub: Path
    kubelet_client: tuple[Path, Path]

    @classmethod
    def create(cls, directory: Path, node_ips: tuple[str, ...] = ()) -> Pki:
        """`node_ips`: more addresses the API server is reached at (the node's, for pods)."""
        directory.mkdir(parents=True, exist_ok=True)
        ca = CA.create(directory, "ca")
        fp = CA.create(directory, "front-proxy-ca")
        serving = ca.issue(
            directory, "apiserver", "kube-apiserver",
            dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 "kubernetes.default.svc.cluster.local"),
            ips=("127.0.0.1", "10.0.0.1", *node_ips),
            server=True,
        )
        admin = ca.issue(directory, "admin", "admin", orgs=("system:masters",), client=True)
        fpc = fp.issue(directory, "front-proxy-client", "front-proxy-client", client=True)
        kubelet_client = ca.issue(directory, "apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                                  orgs=("system:masters",), client=True)
        sa = _key()
        sa_key, sa_pub = directory / "sa.key", directory / "sa.pub"
        sa_key.write_bytes(_key_pem(sa))
        sa_key.chmod(0o600)
        sa_pub.write_bytes(
            sa.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
        return cls(directory, ca, fp, serving, admin, fpc, sa_key, sa_pub, kubelet_client)
