"""A real one-host Slurm cluster (Debian's ``slurm-wlm`` and ``munge``) in a temporary directory,
for ``gpuops demo --slurm`` (``gpuops.sim.slurmdemo``) and the Slurm tests
(``tests/integration/slurm``,
``tests/e2e/slurm``).

munged on its own socket, slurmctld and one slurmd per static node on free loopback ports, and
``State=CLOUD`` nodes whose slurmd the ``ResumeProgram`` starts and the ``SuspendProgram`` stops.
Every daemon is stopped by its pid; every Slurm command runs with a timeout. Facts of Slurm 22.05
this relies on: GPU GRES needs ``File=`` (symlinks to /dev/null, ``AutoDetect=off``); programs
started by slurmctld do not inherit ``SLURM_CONF`` (the scripts set it); a slurmd that a
ResumeProgram starts needs ``-b`` and redirected stdio; a requeued job waits ``cred_expire``.
Runs as root (slurmd must).
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

COMMAND_TIMEOUT_S = 10.0
"""Seconds any Slurm command may take here (they hang while slurmctld is down)."""
CRED_EXPIRE_S = 5
"""Seconds a requeued job waits before it may start again (Slurm's default 120 s)."""


def free_port() -> int:
    """A TCP port that was free a moment ago on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Poll ``condition`` until it is truthy; ``RuntimeError`` naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    gpus: int = 2
    cpus: int = 2
    cloud: bool = False
    first_minor: int = 0
    """Its GPUs are /dev/nvidia<first_minor>..: GRES index 0 is not always minor number 0."""


@dataclass
class SlurmCluster:
    root: Path
    nodes: Sequence[NodeSpec] = (
        NodeSpec("gpu-a"),
        NodeSpec("gpu-b", first_minor=2),
        NodeSpec("cloud-1", cloud=True),
    )
    partition: str = "gpu"
    accounting: bool = False
    """Also run Slurm's accounting: a MariaDB of its own (Debian's ``mariadb-server``) and
    ``slurmdbd`` (Debian's ``slurmdbd``) on free loopback ports, so that ``sacct`` reads the
    jobs back (``AccountingStorageTRES=gres/gpu``: their GPUs too)."""
    accounts: Sequence[str] = ()
    """Accounts created in the accounting before the cluster starts (with ``accounting``)."""
    ports: dict[str, int] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def cmd(self, *argv: str, timeout: float = COMMAND_TIMEOUT_S) -> str:
        """Run a Slurm command against this cluster; its stdout (raises on failure)."""
        done = subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv)} exited {done.returncode}: {done.stderr}")
        return done.stdout

    # -- start -----------------------------------------------------------------------------

    def start(self) -> SlurmCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        for name in ("state", "spool", "log", "dev", "munge"):
            (self.root / name).mkdir(exist_ok=True)
        (self.root / "munge").chmod(0o700)
        self._start_munge()
        self.ports["ctld"] = free_port()
        if self.accounting:
            self.ports["db"], self.ports["dbd"] = free_port(), free_port()
        for node in self.nodes:
            self.ports[node.name] = free_port()
        self._write_config()
        try:
            if self.accounting:
                self._start_accounting()
            self._spawn(
                "slurmctld",
                ["slurmctld", "-D", "-i", "-f", str(self.conf)],
            )
            wait_for(self._controller_up, 20, "slurmctld to answer")
            for node in self.nodes:
                if not node.cloud:
                    self._spawn(
                        f"slurmd-{node.name}",
                        ["slurmd", "-D", "-N", node.name, "-f", str(self.conf)],
                    )
            static = [n.name for n in self.nodes if not n.cloud]
            wait_for(lambda: self._all_idle(static), 30, f"nodes {static} to be idle")
            # CLOUD nodes wait as gpuops standby: drained, so that Slurm's power saving does
            # not power them up for pending jobs by itself; gpuops' scale_out does (docs/slurm.md).
            for node in self.nodes:
                if node.cloud:
                    self.cmd(
                        "scontrol",
                        "update",
                        f"nodename={node.name}",
                        "state=drain",
                        "reason=gpuops:standby",
                    )
        except BaseException:
            self.stop()
            raise
        return self

    def _start_munge(self) -> None:
        d = self.root / "munge"
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._spawn(
            "munged",
            [
                "munged",
                "-F",
                "--force",
                f"--socket={d / 'munge.socket'}",
                f"--key-file={key}",
                f"--pid-file={d / 'munged.pid'}",
                f"--log-file={d / 'munged.log'}",
                f"--seed-file={d / 'munged.seed'}",
            ],
        )
        wait_for(lambda: (d / "munge.socket").exists(), 10, "munged's socket")

    def _write_config(self) -> None:
        r = self.root
        host = socket.gethostname().split(".")[0]
        resume, suspend = r / "resume.sh", r / "suspend.sh"
        static_names = ",".join(n.name for n in self.nodes if not n.cloud)
        conf = [
            "ClusterName=gpuops-test",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={self.ports['ctld']}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={r / 'munge' / 'munge.socket'},cred_expire={CRED_EXPIRE_S}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}/%n",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'log'}/slurmd-%n.pid",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log'}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",
            "GresTypes=gpu",
            "ReturnToService=2",
            "SchedulerType=sched/builtin",
            # A requeued job may start once cred_expire has passed; the main scheduling loop
            # (default every 60 s) is what starts it then.
            "SchedulerParameters=sched_interval=1",
            "JobAcctGatherType=jobacct_gather/none",
            *self._accounting_config(),
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={r / 'log' / 'jobcomp.log'}",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "MessageTimeout=5",
            "SlurmdTimeout=5",
            "KillWait=1",
            "MinJobAge=600",
            "RequeueExit=42",  # a batch job exiting 42 goes back to the queue (tests of reruns)
            "InactiveLimit=0",
            "Waittime=0",
            f"ResumeProgram={resume}",
            f"RebootProgram={r / 'reboot.sh'}",
            f"SuspendProgram={suspend}",
            "SuspendTime=3600",
            f"SuspendExcNodes={static_names}",
            "ResumeTimeout=30",
            "SuspendTimeout=5",
            "TreeWidth=64",
            "PrivateData=cloud",
        ]
        gres = ["AutoDetect=off"]
        for node in self.nodes:
            port = self.ports[node.name]
            state = "CLOUD" if node.cloud else "UNKNOWN"
            conf.append(
                f"NodeName={node.name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                f"CPUs={node.cpus} RealMemory=1000 Gres=gpu:{node.gpus} State={state}"
            )
            devdir = r / "dev" / node.name
            devdir.mkdir(parents=True, exist_ok=True)
            first, last = node.first_minor, node.first_minor + node.gpus - 1
            for i in range(first, last + 1):
                link = devdir / f"nvidia{i}"
                if not link.exists():
                    link.symlink_to("/dev/null")
            gres.append(f"NodeName={node.name} Name=gpu File={devdir}/nvidia[{first}-{last}]")
        names = ",".join(n.name for n in self.nodes)
        conf.append(
            f"PartitionName={self.partition} Nodes={names} Default=YES MaxTime=INFINITE State=UP"
        )
        self.conf.write_text("\n".join(conf) + "\n")
        (r / "gres.conf").write_text("\n".join(gres) + "\n")
        q = shlex.quote
        resume.write_text(
            "#!/bin/sh\n"
            f"export SLURM_CONF={q(str(self.conf))}\n"
            'for n in $(scontrol show hostnames "$1"); do\n'
            f'  slurmd -b -N "$n" -f {q(str(self.conf))} '
            f"</dev/null >>{q(str(r / 'log'))}/resume.log 2>&1\n"
            "done\n"
        )
        suspend.write_text(
            "#!/bin/sh\n"
            f"export SLURM_CONF={q(str(self.conf))}\n"
            'for n in $(scontrol show hostnames "$1"); do\n'
            f"  pidfile={q(str(r / 'log'))}/slurmd-$n.pid\n"
            '  [ -f "$pidfile" ] && kill "$(cat "$pidfile")"\n'
            "done\n"
            "exit 0\n"
        )
        resume.chmod(0o755)
        suspend.chmod(0o755)
        self._write_reboot()

    def _write_reboot(self) -> None:
        """The ``RebootProgram``: slurmd runs it with no arguments. It finds its slurmd among
        its ancestors, notes the node in ``log/reboots.log``, and has a detached helper stop
        that slurmd and start a new one with ``-b`` (which reports a fresh boot), so that the
        node registers as rebooted."""
        r, q = self.root, shlex.quote
        reboot, restart = r / "reboot.sh", r / "restart.sh"
        reboot.write_text(
            "#!/bin/sh\n"
            "p=$$\n"
            'while [ "$p" -gt 1 ] && [ "$(cat /proc/$p/comm)" != slurmd ]; do\n'
            "  p=$(cut -d' ' -f4 /proc/$p/stat)\n"
            "done\n"
            "node=$(tr '\\0' '\\n' </proc/$p/cmdline | sed -n '/^-N$/{n;p}')\n"
            f'echo "$node" >>{q(str(r / "log" / "reboots.log"))}\n'
            f'setsid {q(str(restart))} "$node" "$p" </dev/null >/dev/null 2>&1 &\n'
            "exit 0\n"
        )
        restart.write_text(
            "#!/bin/sh\n"
            'kill "$2"\n'
            "while [ -e /proc/$2 ] && [ \"$(cut -d' ' -f3 /proc/$2/stat)\" != Z ]; do\n"
            "  sleep 0.05\n"
            "done\n"
            f"export SLURM_CONF={q(str(self.conf))}\n"
            f'exec slurmd -b -N "$1" -f {q(str(self.conf))} '
            f"</dev/null >>{q(str(r / 'log'))}/reboot.log 2>&1\n"
        )
        reboot.chmod(0o755)
        restart.chmod(0o755)

    def reboots(self) -> list[str]:
        """The nodes the ``RebootProgram`` rebooted, in order."""
        path = self.root / "log" / "reboots.log"
        return path.read_text().split() if path.exists() else []

    def _accounting_config(self) -> list[str]:
        if not self.accounting:
            return ["AccountingStorageType=accounting_storage/none"]
        return [
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=127.0.0.1",
            f"AccountingStoragePort={self.ports['dbd']}",
            # the munge socket of the connection to slurmdbd (AuthInfo's is not used for it)
            f"AccountingStoragePass={self.root / 'munge' / 'munge.socket'}",
            "AccountingStorageTRES=gres/gpu",
        ]

    def _start_accounting(self) -> None:
        """MariaDB (no grant tables: only this host's loopback reaches it), then slurmdbd on
        it, then the cluster registered with ``sacctmgr``."""
        r = self.root
        (r / "db").mkdir(exist_ok=True)
        self._spawn(
            "mariadbd",
            [
                "mariadbd",
                "--no-defaults",
                f"--datadir={r / 'db'}",
                f"--socket={r / 'db.sock'}",
                f"--port={self.ports['db']}",
                "--bind-address=127.0.0.1",
                "--user=root",
                "--skip-grant-tables",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=16M",
                f"--pid-file={r / 'db.pid'}",
            ],
        )
        wait_for(lambda: self._alive("mariadbd") and (r / "db.sock").exists(), 30, "MariaDB")
        dbd = r / "slurmdbd.conf"
        dbd.write_text(
            "\n".join(
                [
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={r / 'munge' / 'munge.socket'}",
                    "DbdHost=localhost",
                    "DbdAddr=127.0.0.1",
                    f"DbdPort={self.ports['dbd']}",
                    "SlurmUser=root",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=127.0.0.1",
                    f"StoragePort={self.ports['db']}",
                    "StorageUser=root",
                    "StorageLoc=slurm_acct_db",
                    f"PidFile={r / 'slurmdbd.pid'}",
                    f"LogFile={r / 'log' / 'slurmdbd.log'}",
                ]
            )
            + "\n"
        )
        dbd.chmod(0o600)
        self._spawn("slurmdbd", ["slurmdbd", "-D"])
        wait_for(self._dbd_up, 30, "slurmdbd to answer")
        self.cmd("sacctmgr", "-i", "add", "cluster", "gpuops-test")
        self._add_accounts(self.accounts)

    def _add_accounts(self, names: Sequence[str]) -> None:
        """Accounts ``names`` in the accounting, root a user of each (``sbatch -A NAME``),
        before slurmctld starts (it reconfigures when they change under it)."""
        for name in names:
            self.cmd("sacctmgr", "-i", "add", "account", name, "cluster=gpuops-test")
            self.cmd("sacctmgr", "-i", "add", "user", "root", f"account={name}")

    def _alive(self, name: str) -> bool:
        proc = self.procs[name]
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited {proc.returncode}: {self.log_tail(name)}")
        return True

    def _dbd_up(self) -> bool:
        self._alive("slurmdbd")
        try:
            self.cmd("sacctmgr", "-n", "show", "cluster", timeout=5)
        except (RuntimeError, subprocess.TimeoutExpired):
            return False
        return True

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.root / "log" / f"{name}.out").open("ab")
        self.procs[name] = subprocess.Popen(
            argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            cwd=self.root,  # a daemon's core file, if any, stays with the cluster
        )
        log.close()

    def _controller_up(self) -> bool:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited {proc.returncode}: {self.log_tail(name)}")
        try:
            self.cmd("scontrol", "ping", timeout=5)
        except (RuntimeError, subprocess.TimeoutExpired):
            return False
        return True

    def _all_idle(self, names: Sequence[str]) -> bool:
        states = self.node_states()
        return all(states.get(n, "").startswith("idle") for n in names)

    def node_states(self) -> dict[str, str]:
        out = self.cmd("sinfo", "-h", "-N", "-o", "%N %T")
        return dict(line.split(None, 1) for line in out.splitlines() if line.strip())

    def log_tail(self, name: str, lines: int = 20) -> str:
        for path in (self.root / "log" / f"{name}.out", self.root / "log" / f"{name}.log"):
            if path.exists():
                return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    # -- stop ------------------------------------------------------------------------------

    @property
    def gres_conf(self) -> Path:
        return self.root / "gres.conf"

    def submit(self, *args: str) -> str:
        """sbatch with ``args``; the job id."""
        out = self.cmd("sbatch", "--parsable", *args)
        return out.strip().split(";")[0]

    def stop_controller(self) -> None:
        proc = self.procs.pop("slurmctld")
        proc.kill()
        proc.wait(timeout=10)

    def start_slurmd(self, node: str) -> None:
        """(Re)start a static node's slurmd; it registers and the node answers again."""
        self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(self.conf)])

    def kill_slurmd(self, node: str) -> None:
        """The node's slurmd dies (SIGKILL): slurmctld marks the node down after SlurmdTimeout."""
        proc = self.procs.pop(f"slurmd-{node}")
        proc.kill()
        proc.wait(timeout=10)

    def stop(self) -> None:
        # slurmd started by the ResumeProgram: stopped by the pid files they wrote.
        for pidfile in (self.root / "log").glob("slurmd-*.pid"):
            node = pidfile.name[len("slurmd-") : -len(".pid")]
            proc = self.procs.get(f"slurmd-{node}")
            if proc is not None and proc.poll() is None:
                continue  # ours, stopped below; one that exited was rebooted by a new one
            try:
                os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)
            except (ValueError, ProcessLookupError, OSError):
                pass
        # Job steps (slurmstepd and the job's programs) outlive their slurmd: found by the
        # SLURM_CONF of this cluster in their environment, killed by pid.
        for pid in self._job_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for name in reversed(list(self.procs)):
            proc = self.procs.pop(name)
            if proc.poll() is None:
                proc.kill()  # a test cluster's state is thrown away: no graceful shutdown
                proc.wait(timeout=10)

    def _job_pids(self) -> list[int]:
        marker = f"SLURM_CONF={self.conf}".encode()
        own = {p.pid for p in self.procs.values()}
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in own or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
            except OSError:
                continue
            if marker in environ.split(b"\0"):
                pids.append(int(entry.name))
        return pids
