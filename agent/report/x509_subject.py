"""OpenSSL's subject-name hash of a certificate, as ``openssl x509 -noout -subject_hash`` prints it; pure.

OpenSSL's by-directory trust lookup (``capath``, what ``c_rehash`` prepares) opens only the files named
``<hash>.<n>`` of the issuer it looks for, where ``<hash>`` is this hash (X509_NAME_hash_ex): the first four bytes
of SHA-1 over the name's canonical encoding, read little-endian, as eight lowercase hex digits. The canonical
encoding (OpenSSL's x509_name_canon and asn1_string_canon, crypto/x509/x_name.c) is the concatenation of each
relative distinguished name's DER SET (no outer SEQUENCE), each attribute's value re-encoded as a UTF8String when
it is a text type (UTF8, BMP, Universal, Printable, T61 as Latin-1, IA5, Visible): ASCII whitespace trimmed at both
ends and each inner run made one space, ASCII letters lowercased, other bytes as they are. Other value types are
kept as they are; the members of a multi-valued RDN are sorted as DER sorts a SET OF.

The DER reader is small and strict (definite, minimal lengths; every element ends where its parent says) and
bounded (depth, size); anything else is :class:`CertificateInvalid`. Used by agent/report/tls_anchors.py.
"""

from __future__ import annotations

import hashlib
from typing import List

from agent.errors import InputFileError

# The largest certificate read (public roots are 1 to 2 kB; a name with every extension is far below this).
MAX_CERTIFICATE_BYTES = 64 << 10

_SEQUENCE, _SET, _OID = 0x30, 0x31, 0x06
_UTF8STRING = 0x0C
# Tag -> how its bytes become code points: "utf-8", "latin-1" (one byte a character), "utf-16-be", "utf-32-be".
_TEXT_TAGS = {0x0C: "utf-8", 0x13: "latin-1", 0x14: "latin-1", 0x16: "latin-1", 0x1A: "latin-1",
              0x1E: "utf-16-be", 0x1C: "utf-32-be"}
_ASCII_SPACE = b" \t\n\v\f\r"


class CertificateInvalid(InputFileError):
    """A certificate in a CA file is not DER that this reader takes (the message names the file and the field)."""


class _Element:
    """One DER element: its tag, the whole TLV and where its value lies in ``data``."""

    __slots__ = ("tag", "data", "start", "end", "tlv_start")

    def __init__(self, tag: int, data: bytes, tlv_start: int, start: int, end: int) -> None:
        self.tag, self.data, self.tlv_start, self.start, self.end = tag, data, tlv_start, start, end

    @property
    def tlv(self) -> bytes:
        return self.data[self.tlv_start:self.end]

    @property
    def value(self) -> bytes:
        return self.data[self.start:self.end]


def _read(data: bytes, offset: int, limit: int, where: str, source: str) -> _Element:
    """The element at ``offset``, which must end by ``limit``; single-byte tags, definite minimal lengths."""
    if offset + 2 > limit:
        raise CertificateInvalid(source, f"{where}: cut short")
    tag = data[offset]
    if tag & 0x1F == 0x1F:
        raise CertificateInvalid(source, f"{where}: a multi-byte tag")
    first = data[offset + 1]
    start = offset + 2
    if first < 0x80:
        length = first
    else:
        count = first & 0x7F
        if count == 0 or count > 4 or start + count > limit:
            raise CertificateInvalid(source, f"{where}: an indefinite or oversized length")
        length = int.from_bytes(data[start:start + count], "big")
        if length < 0x80 or data[start] == 0:
            raise CertificateInvalid(source, f"{where}: a length not in its shortest form")
        start += count
    end = start + length
    if end > limit:
        raise CertificateInvalid(source, f"{where}: runs past its container")
    return _Element(tag, data, offset, start, end)


def _children(parent: _Element, where: str, source: str) -> List[_Element]:
    """The elements that make up a constructed element's value, exactly."""
    found, offset = [], parent.start
    while offset < parent.end:
        child = _read(parent.data, offset, parent.end, where, source)
        found.append(child)
        offset = child.end
    return found


def _expect(element: _Element, tag: int, where: str, source: str) -> _Element:
    if element.tag != tag:
        raise CertificateInvalid(source, f"{where}: tag 0x{element.tag:02x}, not 0x{tag:02x}")
    return element


def _tlv(tag: int, value: bytes) -> bytes:
    """DER of one element (definite, minimal length)."""
    size = len(value)
    if size < 0x80:
        return bytes((tag, size)) + value
    length = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes((tag, 0x80 | len(length))) + length + value


def subject_name_der(certificate: bytes, source: str = "certificate") -> bytes:
    """The subject Name (its whole DER SEQUENCE) of a DER certificate; CertificateInvalid when it is not one."""
    if len(certificate) > MAX_CERTIFICATE_BYTES:
        raise CertificateInvalid(source, f"over {MAX_CERTIFICATE_BYTES} bytes")
    outer = _expect(_read(certificate, 0, len(certificate), "Certificate", source), _SEQUENCE, "Certificate", source)
    if outer.end != len(certificate):
        raise CertificateInvalid(source, "Certificate: bytes after its end")
    parts = _children(outer, "Certificate", source)
    if len(parts) != 3:
        raise CertificateInvalid(source, f"Certificate: {len(parts)} elements, not 3")
    tbs = _children(_expect(parts[0], _SEQUENCE, "tbsCertificate", source), "tbsCertificate", source)
    if tbs and tbs[0].tag == 0xA0:  # [0] EXPLICIT version
        tbs = tbs[1:]
    # serialNumber, signature, issuer, validity, subject, ...
    if len(tbs) < 6:
        raise CertificateInvalid(source, "tbsCertificate: fewer fields than serial .. subjectPublicKeyInfo")
    return _expect(tbs[4], _SEQUENCE, "tbsCertificate -> subject", source).tlv


def _canonical_text(tag: int, value: bytes, where: str, source: str) -> bytes:
    """A text value as asn1_string_canon makes it: UTF-8, trimmed, inner whitespace runs one space, ASCII lower."""
    encoding = _TEXT_TAGS[tag]
    try:
        # surrogatepass: OpenSSL turns each BMP code unit into UTF-8 on its own, pairs not joined
        text = value.decode(encoding, "surrogatepass") if encoding.startswith("utf-16") else value.decode(encoding)
        utf8 = text.encode("utf-8", "surrogatepass")
    except (UnicodeDecodeError, UnicodeEncodeError):
        raise CertificateInvalid(source, f"{where}: not valid {encoding} text") from None
    out = bytearray()
    in_space = False
    for byte in utf8.strip(_ASCII_SPACE):
        if byte in _ASCII_SPACE:
            if not in_space:
                out.append(0x20)
            in_space = True
            continue
        in_space = False
        out.append(byte + 32 if 0x41 <= byte <= 0x5A else byte)
    return bytes(out)


def canonical_name(name_der: bytes, source: str = "certificate") -> bytes:
    """OpenSSL's canonical encoding of a DER Name (x509_name_canon); b"" for an empty name."""
    name = _expect(_read(name_der, 0, len(name_der), "subject", source), _SEQUENCE, "subject", source)
    encoded = []
    for index, rdn in enumerate(_children(name, "subject", source), 1):
        where = f"subject -> RDN {index}"
        members = []
        for atv in _children(_expect(rdn, _SET, where, source), where, source):
            fields = _children(_expect(atv, _SEQUENCE, where, source), where, source)
            if len(fields) != 2:
                raise CertificateInvalid(source, f"{where}: an attribute of {len(fields)} elements, not 2")
            oid, value = _expect(fields[0], _OID, f"{where} -> type", source), fields[1]
            if value.tag in _TEXT_TAGS:
                value_der = _tlv(_UTF8STRING, _canonical_text(value.tag, value.value, f"{where} -> value", source))
            else:
                value_der = value.tlv
            members.append(_tlv(_SEQUENCE, oid.tlv + value_der))
        encoded.append(_tlv(_SET, b"".join(sorted(members))))
    return b"".join(encoded)


def name_hash(name_der: bytes, source: str = "certificate") -> str:
    """X509_NAME_hash_ex of a DER Name: eight lowercase hex digits."""
    digest = hashlib.sha1(canonical_name(name_der, source), usedforsecurity=False).digest()
    return f"{int.from_bytes(digest[:4], 'little'):08x}"


def subject_hash(certificate: bytes, source: str = "certificate") -> str:
    """``openssl x509 -noout -subject_hash`` of a DER certificate."""
    return name_hash(subject_name_der(certificate, source), source)

