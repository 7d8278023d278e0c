"""A real PostgreSQL for tests and benchmarks: ``initdb`` in a temporary directory, ``postgres``
on a free loopback port with its unix socket in that directory, stopped by pid.

PostgreSQL refuses to run as root; as root (CI, this machine) the server runs as the
``postgres`` system user (the Debian package ``postgresql`` creates it) through ``setpriv``,
which execs in place, so the pid we hold is the postmaster's. The superuser's password is
written to a file, as a deployment would hand it to the engine (``state.password_file``).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from gpuops.sources.promproc import free_port

PASSWORD = "gpuops-test-secret"
"""The superuser's password in the test cluster (also the redaction tests' secret)."""


def bin_dir() -> Path:
    """The directory of ``initdb``/``postgres``: on PATH, else Debian's newest
    ``/usr/lib/postgresql/*/bin``."""
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    if not candidates:
        raise RuntimeError(
            "PostgreSQL is not installed (no initdb on PATH nor in /usr/lib/postgresql/*/bin):"
            " apt-get install postgresql (make test does)"
        )
    return Path(candidates[-1]).parent


class PostgresServer:
    """One throw-away cluster. ``url`` names it without the password (``password_file`` holds
    it); ``dsn`` carries it, for the tests' own connections."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="gpuops-pg-"))
        self.data = self.dir / "data"
        self.password_file = self.dir / "password"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._user: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            try:
                self._user = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError(
                    "running as root, and PostgreSQL refuses root: no 'postgres' user to run it"
                    " as (apt-get install postgresql creates it)"
                ) from None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres:{PASSWORD}@127.0.0.1:{self.port}/postgres"

    def _as_server_user(self, argv: list[str]) -> list[str]:
        if self._user is None:
            return argv
        return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", *argv]

    def start(self, timeout: float = 30.0) -> None:
        bindir = bin_dir()
        self.password_file.write_text(PASSWORD + "\n")
        pwfile = self.dir / "initdb-password"
        pwfile.write_text(PASSWORD + "\n")
        if self._user is not None:
            for path in (self.dir, pwfile):
                os.chown(path, self._user.pw_uid, self._user.pw_gid)
        subprocess.run(
            self._as_server_user(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    "postgres",
                    "--auth-local=trust",
                    "--auth-host=scram-sha-256",
                    f"--pwfile={pwfile}",
                    "--no-sync",
                    "-E",
                    "UTF8",
                ]
            ),
            check=True,
            capture_output=True,
        )
        pwfile.unlink()
        log = open(self.dir / "postgres.log", "ab")  # noqa: SIM115 - the server's lifetime
        self.proc = subprocess.Popen(
            self._as_server_user(
                [
                    str(bindir / "postgres"),
                    "-D",
                    str(self.data),
                    "-p",
                    str(self.port),
                    "-k",
                    str(self.dir),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "fsync=off",
                    "-c",
                    "max_connections=100",
                ]
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.dsn, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    tail = (self.dir / "postgres.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"PostgreSQL did not start: {tail}") from None
                time.sleep(0.05)

    def database(self, name: str) -> str:
        """Create database ``name`` (fresh) and return its URL (no password in it)."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
