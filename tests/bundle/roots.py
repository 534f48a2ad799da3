"""Root metadata for the role tests: real gpg keys, a root.json written and signed by a threshold of them."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from tests.bundle.keys import Signer


def public_block(signer: Signer, directory: Path) -> str:
    """The signer's public key as base64 of ``gpg --export`` (what a root's ``keys`` holds)."""
    return base64.b64encode(signer.export(directory / f"{signer.fingerprint}.gpg").read_bytes()).decode()


def role(name: str, signers: Sequence[Signer], threshold: int, scope: Optional[Dict[str, object]] = None) -> dict:
    """One policy role (scope: every host unless given)."""
    return {"name": name, "keys": [s.fingerprint for s in signers], "threshold": threshold,
            "scope": scope or {"all": True}}


def write_root(path: Path, version: int, root_keys: Sequence[Signer], root_threshold: int, policy: List[dict],
               freshness: Sequence[Signer], everyone: Sequence[Signer], expires: str = "2099-01-01T00:00:00Z") -> Path:
    """Write root.json (version, roles, the public keys of ``everyone``) to ``path``; unsigned."""
    keys = {s.fingerprint: public_block(s, path.parent) for s in everyone}
    document = {"format": "gpuguard-root/1", "version": version, "expires": expires, "keys": keys,
                "root": {"keys": [s.fingerprint for s in root_keys], "threshold": root_threshold},
                "freshness": {"keys": [s.fingerprint for s in freshness], "threshold": 1}, "policy": policy}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    return path


def sign_by(path: Path, signers: Sequence[Signer], signature: Optional[Path] = None) -> Path:
    """One detached-signature file holding a signature by each of ``signers`` (concatenated, as gpgv reads it)."""
    target = signature or path.with_name(path.name + ".sig")
    parts = []
    for index, signer in enumerate(signers):
        part = path.with_name(f"{path.name}.part{index}")
        signer.sign(path, part)
        parts.append(part.read_bytes())
        part.unlink()
    target.write_bytes(b"".join(parts))
    return target
