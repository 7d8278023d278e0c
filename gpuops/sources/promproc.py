"""Runs a real Prometheus or Alertmanager binary as a child process (demo, tests, `rules test`).

Config and data live in a directory the caller owns; the listen port is a free loopback port.
Readiness is waited for by polling ``/-/ready`` until a deadline, never by sleeping blindly.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

import requests

log = logging.getLogger(__name__)


class ProcessError(RuntimeError):
    """The binary is missing, or did not become ready."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def find_binary(*names: str) -> str:
    for name in names:
        path = shutil.which(name) or (
            f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None
        )
        if path:
            return path
    raise ProcessError(
        f"none of {', '.join(names)} found on PATH; install the Debian package "
        "(make test and make demo do it)"
    )


class _Server:
    binary_names: tuple[str, ...] = ()
    kind = ""

    def __init__(self, workdir: Path, port: int | None = None) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}
        """Variables added to the server's environment (e.g. ``GOGC``), set before start."""
        self.log_path = self.workdir / f"{self.kind}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def args(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 30.0) -> None:
        binary = find_binary(*self.binary_names)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [binary, *self.args()],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, **self.env} if self.env else None,
            )
        self.wait_ready(timeout)
        log.info("%s ready at %s (pid %d)", self.kind, self.url, self.proc.pid)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise ProcessError(f"{self.kind} exited with {self.proc.returncode}:\n{tail}")
            try:
                if requests.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)
        self.stop()
        raise ProcessError(f"{self.kind} was not ready at {self.url} within {timeout:.0f}s")

    def reload(self) -> None:
        requests.post(f"{self.url}/-/reload", timeout=5).raise_for_status()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def __enter__(self) -> _Server:
        self.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class PrometheusServer(_Server):
    """A real Prometheus with ``config`` (YAML text) written to ``workdir/prometheus.yml``."""

    binary_names = ("prometheus",)
    kind = "prometheus"

    def __init__(
        self,
        workdir: Path,
        config: str,
        port: int | None = None,
        extra_args: list[str] | None = None,
        data_dir: Path | None = None,
    ) -> None:
        super().__init__(workdir, port)
        self.config_path = self.workdir / "prometheus.yml"
        self.config_path.write_text(config)
        self.extra_args = list(extra_args or [])
        self.data_dir = data_dir or self.workdir / "data"

    def args(self) -> list[str]:
        return [
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
            *self.extra_args,
        ]


class AlertmanagerServer(_Server):
    """A real Alertmanager (Debian binary ``prometheus-alertmanager``) on loopback."""

    binary_names = ("prometheus-alertmanager", "alertmanager")
    kind = "alertmanager"

    def __init__(self, workdir: Path, config: str, port: int | None = None) -> None:
        super().__init__(workdir, port)
        self.config_path = self.workdir / "alertmanager.yml"
        self.config_path.write_text(config)

    def args(self) -> list[str]:
        return [
            f"--config.file={self.config_path}",
            f"--storage.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",
        ]


class VictoriaMetricsServer(_Server):
    """A real single-node VictoriaMetrics (Debian package ``victoria-metrics``) on loopback: it
    serves the Prometheus query API (``/api/v1/query``) and takes data by
    ``/api/v1/import/prometheus`` (``import_text``) or remote write. ``-search.latencyOffset=0s``:
    by default it hides the last 30 s of samples from queries (ingestion may still be in
    flight), which a test that writes and then queries must not have."""

    binary_names = ("victoria-metrics", "victoria-metrics-prod")
    kind = "victoria-metrics"

    def __init__(
        self, workdir: Path, port: int | None = None, extra_args: list[str] | None = None
    ) -> None:
        super().__init__(workdir, port)
        self.extra_args = list(extra_args or [])

    def args(self) -> list[str]:
        return [
            f"-httpListenAddr=127.0.0.1:{self.port}",
            f"-storageDataPath={self.workdir / 'data'}",
            "-retentionPeriod=100y",
            "-search.latencyOffset=0s",
            *self.extra_args,
        ]

    def import_text(self, text: str) -> None:
        """Import Prometheus exposition lines (timestamps in milliseconds) and make them
        searchable at once."""
        response = requests.post(f"{self.url}/api/v1/import/prometheus", data=text, timeout=120)
        response.raise_for_status()
        requests.get(f"{self.url}/internal/force_flush", timeout=60).raise_for_status()
