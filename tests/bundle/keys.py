"""Real OpenPGP keys and signatures for the bundle tests: gpg in a throwaway GNUPGHOME, keyrings by ``gpg --export``."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import List, Optional

from tests.needs import unavailable


def _run(home: Path, args: List[str]) -> str:
    """gpg in ``home``; the gpg-agent it starts for the secret key is ended again, so no test leaves one running."""
    env = {"GNUPGHOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
    for _ in range(3):
        try:
            done = subprocess.run(["gpg", "--batch", "--yes", *args], env=env, capture_output=True, timeout=60,
                                  check=False)
        finally:
            _end_agent(home)
        # gpg starts its agent on demand; one that the previous call's --kill is still ending answers "End of file"
        # (seen in a loaded fresh root): start it again rather than fail the test on gpg's own race.
        if done.returncode == 0 or b"can't connect to the agent" not in done.stderr:
            break
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout.decode()


def _end_agent(home: Path) -> None:
    """End the gpg-agent of ``home``, if one runs (gpgconf finds it by its home's socket, not by a name)."""
    subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "gpg-agent"], capture_output=True, timeout=30,
                   check=False)


class Signer:
    """One signing key in its own GNUPGHOME: sign files, export its public keyring, revoke it."""

    def __init__(self, directory: Path, name: str, expire: str = "never", faked_time: Optional[str] = None) -> None:
        if shutil.which("gpg") is None or shutil.which("gpgv") is None:
            unavailable("signed bundle tests", "gpg and gpgv are not installed")
        self.home = directory / f"gnupg-{name}"
        self.home.mkdir(mode=0o700)
        self.faked = ["--faked-system-time", faked_time] if faked_time else []
        _run(self.home, [*self.faked, "--passphrase", "", "--quick-gen-key", f"{name} <{name}@example>", "ed25519",
                         "sign", expire])
        self.fingerprint = next(line.split(":")[9] for line in _run(
            self.home, ["--with-colons", "--list-keys"]).splitlines() if line.startswith("fpr:"))

    def sign(self, path: Path, signature: Optional[Path] = None, digest: Optional[str] = None) -> Path:
        """A detached binary signature of ``path`` (``path.sig`` unless given), with gpg's digest unless given."""
        target = signature or path.with_name(path.name + ".sig")
        chosen = ["--digest-algo", digest] if digest else []
        _run(self.home, [*self.faked, *chosen, "--detach-sign", "-o", str(target), str(path)])
        return target

    def export(self, keyring: Path) -> Path:
        """Write the public key as a binary keyring file (what an operator puts in /etc/gpuguard/keys/)."""
        keyring.parent.mkdir(parents=True, exist_ok=True)
        keyring.write_bytes(subprocess.run(["gpg", "--batch", "--export"], env={"GNUPGHOME": str(self.home)},
                                           capture_output=True, timeout=60, check=True).stdout)
        return keyring

    def revoke(self) -> None:
        """Import the revocation certificate gpg made with the key, so its export says revoked."""
        (certificate,) = (self.home / "openpgp-revocs.d").glob("*.rev")
        armored = certificate.with_suffix(".asc")
        armored.write_text(certificate.read_text().replace(":-----BEGIN", "-----BEGIN"))
        _run(self.home, ["--import", str(armored)])

    def close(self) -> None:
        """End this home's gpg-agent (each gpg run here ends it already; for a test that ran gpg itself)."""
        _end_agent(self.home)
