"""OpenSSL's subject-name hash computed in Python (agent/report/x509_subject.py) equals the real ``openssl x509
-noout -subject_hash`` for every certificate of certifi's and the system's CA bundles and for generated names that
exercise whitespace, case, BMPString, T61String and multi-valued RDNs; malformed DER is one clear error."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
from pathlib import Path
from typing import List, Tuple

import pytest

from agent.report.x509_subject import CertificateInvalid, subject_hash
from tests.needs import unavailable

SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
_PEM = re.compile(r"-----BEGIN CERTIFICATE-----\n(.*?)-----END CERTIFICATE-----", re.S)


def openssl() -> str:
    """The openssl command, or the test is unavailable."""
    found = shutil.which("openssl")
    if found is None:
        unavailable("the subject-hash comparisons", "no openssl command")
    return found


def certifi_bundle() -> Path:
    """certifi's cacert.pem (what requests trusts by default)."""
    certifi = pytest.importorskip("certifi")
    return Path(certifi.where())


def pem_blocks(path: Path) -> List[str]:
    """The base64 bodies of the file's CERTIFICATE blocks."""
    return _PEM.findall(path.read_text(encoding="ascii"))


def openssl_hash(body: str) -> str:
    """What the real openssl prints for one PEM certificate body."""
    pem = f"-----BEGIN CERTIFICATE-----\n{body}-----END CERTIFICATE-----\n"
    return subprocess.run([openssl(), "x509", "-noout", "-subject_hash"], input=pem, capture_output=True, text=True,
                          check=True, timeout=30).stdout.strip()


@pytest.mark.parametrize("which", ["certifi", "system"])
def test_every_certificate_of_a_public_bundle_hashes_as_openssl_does(which: str) -> None:
    """Each certificate of certifi's cacert.pem and of /etc/ssl/certs/ca-certificates.crt gets openssl's hash."""
    bundle = certifi_bundle() if which == "certifi" else SYSTEM_BUNDLE
    if not bundle.exists():
        unavailable("the system bundle comparison", f"no {bundle}")
    blocks = pem_blocks(bundle)
    assert len(blocks) > 100
    mismatched = [(index, subject_hash(base64.b64decode(body)), openssl_hash(body))
                  for index, body in enumerate(blocks)]
    assert [m for m in mismatched if m[1] != m[2]] == []


# (subject as openssl req -subj takes it, the config's string_mask): whitespace and case in printable strings, a
# multi-valued RDN (given out of DER order), Latin-1 text (T61String under "default"), text beyond Latin-1
# (BMPString under "default"), UTF8String with inner tabs, an empty value.
GENERATED: List[Tuple[str, str]] = [
    ("/C=DE/O=  Example   Corp  /CN=Some  Mixed CASE Name ", "default"),
    ("/O=Fleet/OU=Zeta+CN=alpha root+OU=Beta", "default"),
    ("/O=Fleet\tTabs/CN=Ünïcöde Root", "default"),
    ("/O=Fleet/CN=  Größe 日本 CA  ", "default"),
    ("/O=Fleet/CN=  Größe 日本\t\t CA  ", "utf8only"),
    ("/DC=Example/DC=COM/CN=x", "utf8only"),
    ("/O=Only Organization", "nombstr"),
]


@pytest.mark.parametrize(("subject", "mask"), GENERATED)
def test_generated_names_hash_as_openssl_does(tmp_path: Path, subject: str, mask: str) -> None:
    """A certificate made by ``openssl req`` with a name that exercises canonicalisation gets openssl's hash."""
    config = tmp_path / "req.cnf"
    config.write_text(f"[req]\ndistinguished_name = dn\nstring_mask = {mask}\n[dn]\n", encoding="utf-8")
    cert = tmp_path / "cert.pem"
    subprocess.run([openssl(), "req", "-config", str(config), "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(tmp_path / "key.pem"), "-out",
                    str(cert), "-days", "2", "-utf8", "-multivalue-rdn", "-subj", subject],
                   check=True, capture_output=True, timeout=30)
    (body,) = pem_blocks(cert)
    assert subject_hash(base64.b64decode(body)) == openssl_hash(body)


def test_the_generated_names_use_the_string_types_they_are_meant_to(tmp_path: Path) -> None:
    """The "default" mask gives a BMPString for text beyond Latin-1 and a T61String for Latin-1 (else the table
    above would not test those decodings)."""
    config = tmp_path / "req.cnf"
    config.write_text("[req]\ndistinguished_name = dn\nstring_mask = default\n[dn]\n", encoding="utf-8")
    cert = tmp_path / "cert.pem"
    subprocess.run([openssl(), "req", "-config", str(config), "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(tmp_path / "key.pem"), "-out",
                    str(cert), "-days", "2", "-utf8", "-subj", "/O=Größe/CN=日本"],
                   check=True, capture_output=True, timeout=30)
    dump = subprocess.run([openssl(), "asn1parse", "-in", str(cert)], capture_output=True, check=True,
                          timeout=30).stdout.decode("latin-1")
    assert "T61STRING" in dump and "BMPSTRING" in dump


def a_certificate() -> bytes:
    """The first certificate of certifi's bundle, as DER."""
    return base64.b64decode(pem_blocks(certifi_bundle())[0])


@pytest.mark.parametrize("damage", ["cut", "trailing", "long_form_short_length", "not_a_sequence", "empty"])
def test_malformed_der_is_certificate_invalid_naming_the_source(damage: str) -> None:
    """Cut, padded, non-minimal or mistagged DER is CertificateInvalid whose message names the file, never an
    IndexError."""
    der = a_certificate()
    broken = {"cut": der[:len(der) // 2], "trailing": der + b"\0",
              "long_form_short_length": b"\x30\x81\x03\x02\x01\x00", "not_a_sequence": b"\x04" + der[1:],
              "empty": b""}[damage]
    with pytest.raises(CertificateInvalid) as caught:
        subject_hash(broken, "/etc/ca.pem #3")
    assert str(caught.value).startswith("/etc/ca.pem #3: ")
