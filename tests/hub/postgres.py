"""A throwaway PostgreSQL server for tests: initdb in a temp dir, postgres on a unix socket there, stopped by PID.

PostgreSQL refuses to run as root, so under root the data directory belongs to ``nobody`` and the server runs as
that user. Binaries come from Debian's postgresql package (/usr/lib/postgresql/<version>/bin).
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Dict, Optional

START_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 20.0
SUPERUSER = "gpuguard"


class PostgresUnavailable(Exception):
    """The server could not be found or started; the message says why."""


def find_bindir() -> Optional[Path]:
    """The newest PostgreSQL server bin directory, else None."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                        key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    return Path(candidates[-1]).parent if candidates else None


class PostgresServer:
    """One server process; ``url(db)`` for connections; ``stop()`` ends it by its PID and removes the directory."""

    def __init__(self) -> None:
        self.bindir = find_bindir()
        if self.bindir is None:
            raise PostgresUnavailable("PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin "
                                      "(apt-get install postgresql)")
        self.root = Path(tempfile.mkdtemp(prefix="gg-pg-"))  # short: the socket path must stay under 107 bytes
        self.data = self.root / "data"
        self.log_path = self.root / "server.log"
        self.process: Optional[subprocess.Popen] = None
        self._run_as: Dict[str, str] = {}
        if os.geteuid() == 0:
            self._run_as = {"user": "nobody", "group": "nogroup"}
            os.chown(self.root, *self._ids())

    def _ids(self) -> tuple:
        import grp
        import pwd

        return pwd.getpwnam("nobody").pw_uid, grp.getgrnam("nogroup").gr_gid

    def start(self) -> None:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
        init = subprocess.run(
            [str(self.bindir / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "--auth=trust", "-E", "UTF8",
             "--no-sync"], capture_output=True, text=True, timeout=120, env=env, cwd=str(self.root), **self._run_as)
        if init.returncode != 0:
            raise PostgresUnavailable(f"initdb failed ({init.returncode}): {init.stderr.strip()[-500:]}")
        log_file = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [str(self.bindir / "postgres"), "-D", str(self.data), "-k", str(self.root), "-h", "",
             "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
             "-c", "max_connections=50"],
            stdout=log_file, stderr=subprocess.STDOUT, env=env, cwd=str(self.root), **self._run_as)
        log_file.close()
        self._wait_ready()

    def _wait_ready(self) -> None:
        import psycopg

        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        last_error = ""
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise PostgresUnavailable(f"postgres exited with {self.process.returncode}: {self.log_tail()}")
            try:
                with psycopg.connect(self.url("postgres"), connect_timeout=2):
                    return
            except psycopg.OperationalError as exc:
                last_error = str(exc).strip()
            time.sleep(0.1)
        self.stop()
        raise PostgresUnavailable(f"postgres not ready within {START_TIMEOUT_SECONDS:g} s: {last_error}")

    def url(self, database: str) -> str:
        return f"postgresql://{SUPERUSER}@/{database}?host={self.root}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        import psycopg

        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-800:].strip()
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Fast shutdown by PID (SIGINT), SIGKILL if it lingers; then remove the directory."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(STOP_TIMEOUT_SECONDS)
        shutil.rmtree(self.root, ignore_errors=True)
