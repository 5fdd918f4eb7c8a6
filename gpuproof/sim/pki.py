"""Certificates and keys for the embedded control plane (loopback only, short-lived)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


FRONT_PROXY_CLIENT = "front-proxy-client"


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _sign(subject: x509.Name, pub, issuer: x509.Name, issuer_key, *, ca: bool, usages=(), sans=(), days=365):
    now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
    b = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(pub)
         .serial_number(x509.random_serial_number()).not_valid_before(now)
         .not_valid_after(now + dt.timedelta(days=days))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        b = b.add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
    else:
        b = b.add_extension(x509.KeyUsage(True, True, False, False, False, False, False, False, False), critical=True)
        b = b.add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def make_pki(folder: Path) -> dict[str, Path]:
    """Write a CA, the apiserver's serving pair, an admin client pair, the service-account key pair, and the
    front proxy's CA and client pair (the API server's aggregator shows itself to aggregated APIs with it, as
    kubeadm sets it up: Kueue's visibility API, a custom-metrics adapter)."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {n: folder / n for n in ("ca.crt", "ca.key", "apiserver.crt", "apiserver.key",
                                      "admin.crt", "admin.key", "sa.key", "sa.pub", "front-proxy-ca.crt",
                                      "front-proxy-client.crt", "front-proxy-client.key")}
    ca_key = _key()
    ca_name = _name("gpuproof-sim-ca")
    ca = _sign(ca_name, ca_key.public_key(), ca_name, ca_key, ca=True, days=3650)
    _write_key(files["ca.key"], ca_key)
    _write_cert(files["ca.crt"], ca)

    srv_key = _key()
    sans = [x509.DNSName(n) for n in ("localhost", "kubernetes", "kubernetes.default",
                                      "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", "10.96.0.1")]
    srv = _sign(_name("kube-apiserver"), srv_key.public_key(), ca_name, ca_key, ca=False,
                usages=[ExtendedKeyUsageOID.SERVER_AUTH], sans=sans)
    _write_key(files["apiserver.key"], srv_key)
    _write_cert(files["apiserver.crt"], srv)

    adm_key = _key()
    adm = _sign(_name("gpuproof-admin", "system:masters"), adm_key.public_key(), ca_name, ca_key, ca=False,
                usages=[ExtendedKeyUsageOID.CLIENT_AUTH])
    _write_key(files["admin.key"], adm_key)
    _write_cert(files["admin.crt"], adm)

    fp_key, fp_name = _key(), _name("gpuproof-sim-front-proxy-ca")
    _write_cert(files["front-proxy-ca.crt"], _sign(fp_name, fp_key.public_key(), fp_name, fp_key, ca=True, days=3650))
    client_key = _key()
    _write_key(files["front-proxy-client.key"], client_key)
    _write_cert(files["front-proxy-client.crt"], _sign(_name(FRONT_PROXY_CLIENT), client_key.public_key(), fp_name,
                                                       fp_key, ca=False, usages=[ExtendedKeyUsageOID.CLIENT_AUTH]))

    sa_key = _key()
    _write_key(files["sa.key"], sa_key)
    files["sa.pub"].write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return files
