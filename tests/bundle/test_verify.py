"""Bundle signatures: gpgv's status lines judged purely, and real keys and signatures checked through gpgv."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable

import pytest

from agent.bundle.verify import parse_gpgv_status, trusted_keyrings, verify_signature
from agent.errors import BundleRefused
from agent.host import Host
from tests.bundle.keys import Signer

FPR = "85A60352C13D40F36EF1FC7B39DA316696D82B1C"
GOOD = f"""[GNUPG:] NEWSIG
[GNUPG:] KEY_CONSIDERED {FPR} 0
[GNUPG:] SIG_ID eozJr3v25UdqOT/X6wEP73qO2nc 2026-12-04 1796425943
[GNUPG:] GOODSIG 39DA316696D82B1C test <t@example>
[GNUPG:] VALIDSIG {FPR} 2026-12-04 1796425943 0 4 0 22 8 00 {FPR}
"""
BAD = "[GNUPG:] NEWSIG\n[GNUPG:] BADSIG 39DA316696D82B1C test <t@example>\n"
UNKNOWN = (f"[GNUPG:] NEWSIG\n[GNUPG:] ERRSIG 39DA316696D82B1C 22 8 00 1796425947 9 {FPR}\n"
           "[GNUPG:] NO_PUBKEY 39DA316696D82B1C\n")
EXPIRED = ("[GNUPG:] NEWSIG\n[GNUPG:] KEYEXPIRED 1577923200\n[GNUPG:] EXPKEYSIG C8FC409AFDED6DAD exp <e@example>\n"
           f"[GNUPG:] VALIDSIG {FPR} 2020-01-01 1577840400 0 4 0 22 8 00 {FPR}\n")
REVOKED = ("[GNUPG:] NEWSIG\n[GNUPG:] REVKEYSIG 35A2F064130B5E86 rev <r@example>\n"
           f"[GNUPG:] VALIDSIG {FPR} 2026-12-04 1796425950 0 4 0 22 8 00 {FPR}\n")


@pytest.mark.parametrize(("text", "returncode", "fingerprint", "refusal"), [
    (GOOD, 0, FPR, None),
    (BAD, 1, None, "bad signature (the bundle or the signature was changed) from key 39DA316696D82B1C"),
    (UNKNOWN, 2, None, "signed by key 39DA316696D82B1C, which no trusted keyring holds"),
    (EXPIRED, 0, None, "key C8FC409AFDED6DAD has expired"),
    (REVOKED, 0, None, "key 35A2F064130B5E86 is revoked"),
    ("[GNUPG:] NODATA 1\n[GNUPG:] NODATA 2\n", 2, None, "the signature file holds no OpenPGP signature"),
    ("", 2, None, "no valid signature (gpgv exit 2)"),
    (GOOD + GOOD, 0, None, "2 signatures (exactly one is accepted)"),
    (GOOD, 2, None, "gpgv exit 2"),
    (GOOD.replace(f" {FPR}\n", "\n"), 0, FPR, None),
    (f"[GNUPG:] NEWSIG\n[GNUPG:] ERRSIG 39DA316696D82B1C 22 2 00 1796437029 5 {FPR}\n", 2, None,
     "the signature by key 39DA316696D82B1C uses a refused digest algorithm (SHA-1 or weaker"),
])
def test_status_lines_are_judged(text: str, returncode: int, fingerprint: str, refusal: str) -> None:
    """One VALIDSIG and none of the refusing words with exit 0 is good (the primary fingerprint); else one reason."""
    verdict = parse_gpgv_status(text, returncode)
    assert verdict.fingerprint == fingerprint
    assert verdict.refusal == refusal or (refusal is not None and verdict.refusal is not None
                                          and verdict.refusal.startswith(refusal)), verdict.refusal


def host_with_keys(tmp_path: Path, *signers: Signer) -> Host:
    """A Host whose root holds each signer's keyring in /etc/gpuguard/keys/."""
    root = tmp_path / "root"
    (root / "etc/gpuguard/keys").mkdir(parents=True)
    for index, signer in enumerate(signers):
        signer.export(root / f"etc/gpuguard/keys/{index:02d}-signer.gpg")
    return Host.for_root(str(root))


def bundle_file(tmp_path: Path) -> Path:
    """A file to sign (its content does not matter to gpgv)."""
    path = tmp_path / "bundle.json"
    path.write_bytes(b'{"serial":1}\n')
    return path


def test_a_good_signature_gives_the_signing_key(tmp_path: Path) -> None:
    """A bundle signed by a trusted key verifies and names that key's fingerprint."""
    signer = Signer(tmp_path, "ops")
    bundle = bundle_file(tmp_path)
    signature = signer.sign(bundle)
    assert verify_signature(host_with_keys(tmp_path, signer), str(bundle), str(signature)) == signer.fingerprint


def test_a_tampered_byte_is_refused(tmp_path: Path) -> None:
    """One byte changed after signing: refused as a bad signature."""
    signer = Signer(tmp_path, "ops")
    bundle = bundle_file(tmp_path)
    signature = signer.sign(bundle)
    bundle.write_bytes(bundle.read_bytes().replace(b"1", b"2"))
    with pytest.raises(BundleRefused, match="signature: bad signature") as caught:
        verify_signature(host_with_keys(tmp_path, signer), str(bundle), str(signature))
    assert caught.value.exit_code == 17 and "\n" not in str(caught.value)


def test_an_unknown_key_is_refused(tmp_path: Path) -> None:
    """A signature by a key no trusted keyring holds is refused, naming the key."""
    trusted, stranger = Signer(tmp_path, "ops"), Signer(tmp_path, "mallory")
    bundle = bundle_file(tmp_path)
    signature = stranger.sign(bundle)
    with pytest.raises(BundleRefused, match=f"signed by key {stranger.fingerprint[-16:]}, which no trusted"):
        verify_signature(host_with_keys(tmp_path, trusted), str(bundle), str(signature))


def test_two_trusted_keys_rotate(tmp_path: Path) -> None:
    """With the old and the new key both trusted, either signature verifies; with the old one removed, only the new."""
    old, new = Signer(tmp_path, "old"), Signer(tmp_path, "new")
    bundle = bundle_file(tmp_path)
    by_old, by_new = old.sign(bundle, tmp_path / "old.sig"), new.sign(bundle, tmp_path / "new.sig")
    host = host_with_keys(tmp_path, old, new)
    assert len(trusted_keyrings(host)) == 2
    assert verify_signature(host, str(bundle), str(by_old)) == old.fingerprint
    assert verify_signature(host, str(bundle), str(by_new)) == new.fingerprint
    host.path("/etc/gpuguard/keys/00-signer.gpg").unlink()
    assert verify_signature(host, str(bundle), str(by_new)) == new.fingerprint
    with pytest.raises(BundleRefused, match="which no trusted keyring holds"):
        verify_signature(host, str(bundle), str(by_old))


def test_no_trusted_key_refuses_every_bundle(tmp_path: Path) -> None:
    """Without a keyring in /etc/gpuguard/keys (or without the directory) nothing verifies."""
    signer = Signer(tmp_path, "ops")
    bundle = bundle_file(tmp_path)
    signature = signer.sign(bundle)
    (tmp_path / "root").mkdir()
    with pytest.raises(BundleRefused, match="no trusted key in /etc/gpuguard/keys"):
        verify_signature(Host.for_root(str(tmp_path / "root")), str(bundle), str(signature))


def test_an_expired_or_revoked_key_is_refused(tmp_path: Path) -> None:
    """A key that expired after signing, and a key revoked after signing, are both refused (gpgv itself exits 0)."""
    expired = Signer(tmp_path, "expired", expire="1d", faked_time="20200101T000000")
    revoked = Signer(tmp_path, "revoked")
    bundle = bundle_file(tmp_path)
    by_expired, by_revoked = expired.sign(bundle, tmp_path / "e.sig"), revoked.sign(bundle, tmp_path / "r.sig")
    revoked.revoke()
    host = host_with_keys(tmp_path, expired, revoked)
    with pytest.raises(BundleRefused, match="has expired"):
        verify_signature(host, str(bundle), str(by_expired))
    with pytest.raises(BundleRefused, match="is revoked"):
        verify_signature(host, str(bundle), str(by_revoked))


def test_a_signature_file_that_is_not_one_is_refused(tmp_path: Path) -> None:
    """Garbage in the signature file is refused in one line."""
    signer = Signer(tmp_path, "ops")
    bundle = bundle_file(tmp_path)
    garbage = tmp_path / "bundle.json.sig"
    garbage.write_bytes(b"not a signature\n")
    with pytest.raises(BundleRefused, match="holds no OpenPGP signature"):
        verify_signature(host_with_keys(tmp_path, signer), str(bundle), str(garbage))


def test_a_sha1_signature_is_refused(tmp_path: Path) -> None:
    """A signature over a SHA-1 digest (collisions can be bought) is refused naming the digest, SHA-256 accepted."""
    signer = Signer(tmp_path, "ops")
    bundle = bundle_file(tmp_path)
    host = host_with_keys(tmp_path, signer)
    weak = signer.sign(bundle, tmp_path / "sha1.sig", digest="SHA1")
    with pytest.raises(BundleRefused, match=f"signature: the signature by key {signer.fingerprint[-16:]} uses a "
                                            "refused digest algorithm \\(SHA-1 or weaker"):
        verify_signature(host, str(bundle), str(weak))
    strong = signer.sign(bundle, tmp_path / "sha256.sig", digest="SHA256")
    assert verify_signature(host, str(bundle), str(strong)) == signer.fingerprint


@pytest.mark.parametrize(("what", "change"), [
    ("keys directory", lambda keys: os.chmod(keys, 0o777)),
    ("directory", lambda keys: os.chmod(keys.parent, 0o757)),
    ("keyring", lambda keys: os.chmod(keys / "00-signer.gpg", 0o666)),
    ("keyring", lambda keys: os.chown(keys / "00-signer.gpg", 65534, 65534)),
    ("keys directory", lambda keys: os.chown(keys, 65534, 0)),
])
def test_keys_others_could_change_are_refused(tmp_path: Path, what: str, change: Callable[[Path], None]) -> None:
    """A keys directory, directory above it or keyring that a user other than root can write: every bundle refused,
    naming the file (an unprivileged user could otherwise add a key and sign any policy)."""
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")
    signer = Signer(tmp_path, "ops")
    bundle = bundle_file(tmp_path)
    signature = signer.sign(bundle)
    host = host_with_keys(tmp_path, signer)
    keys = host.path("/etc/gpuguard/keys")
    change(keys)
    refusal = rf"refused \(signature\): trusted keys: {what} {host.root}/etc/gpuguard"
    with pytest.raises(BundleRefused, match=refusal) as caught:
        verify_signature(host, str(bundle), str(signature))
    assert "\n" not in str(caught.value) and ("writable by others" in str(caught.value)
                                              or "owned by uid 65534" in str(caught.value))


@pytest.mark.parametrize(("content", "kind"), [
    (b"-----BEGIN PGP PUBLIC KEY BLOCK-----\n", "armored (gpg --dearmor it)"),
    (b"", "empty"),
    (b"ssh-ed25519 AAAA\n", "not a key"),
])
def test_a_file_that_is_no_keyring_is_named(tmp_path: Path, content: bytes, kind: str) -> None:
    """An armored, empty or foreign file beside a good keyring is named in the refusal (gpgv alone refuses every
    signature then, saying only that no keyring holds the key)."""
    signer = Signer(tmp_path, "ops")
    bundle = bundle_file(tmp_path)
    signature = signer.sign(bundle)
    host = host_with_keys(tmp_path, signer)
    host.path("/etc/gpuguard/keys/99-new.gpg").write_bytes(content)
    with pytest.raises(BundleRefused, match=f"keyring {host.root}/etc/gpuguard/keys/99-new.gpg is not a binary "
                                            f"OpenPGP keyring \\({re.escape(kind)}\\)"):
        verify_signature(host, str(bundle), str(signature))
    host.path("/etc/gpuguard/keys/99-new.gpg").unlink()
    assert verify_signature(host, str(bundle), str(signature)) == signer.fingerprint


@pytest.mark.parametrize("chain", ["direct", "through a second link"])
def test_a_keyring_linked_into_a_world_writable_directory_is_refused(tmp_path: Path, chain: str) -> None:
    """A keyring that is a symlink (directly or through another link) into a world-writable directory is refused
    naming that directory, though the keyring file itself is root-owned and 0644; the same link into a safe
    directory is trusted."""
    signer = Signer(tmp_path, "ops")
    bundle = bundle_file(tmp_path)
    signature = signer.sign(bundle)
    host = host_with_keys(tmp_path)
    safe = host.path("/usr/share/keyrings")
    safe.mkdir(parents=True)
    signer.export(safe / "ops.gpg")
    link = host.path("/etc/gpuguard/keys/ops.gpg")
    link.symlink_to(safe / "ops.gpg")
    assert verify_signature(host, str(bundle), str(signature)) == signer.fingerprint
    drop = host.path("/var/tmp/drop")
    drop.mkdir(parents=True)
    os.chmod(drop, 0o777)
    signer.export(drop / "ops.gpg")
    link.unlink()
    if chain == "direct":
        link.symlink_to(drop / "ops.gpg")
    else:
        (safe / "via.gpg").symlink_to(drop / "ops.gpg")
        link.symlink_to(safe / "via.gpg")
    with pytest.raises(BundleRefused, match=rf"refused \(signature\): trusted keys: directory of keyring {link} -> "
                                            rf"{drop} is writable by others \(mode 0777") as caught:
        verify_signature(host, str(bundle), str(signature))
    assert "\n" not in str(caught.value)

