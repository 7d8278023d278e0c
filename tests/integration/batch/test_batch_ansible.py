"""A batch operation running the shipped playbooks for real (ansible-runner, ansible-playbook)
against several hosts of this machine, each host a local connection to a root folder of its
own — the cheapest way to give many hosts their own files (no sshd, no namespaces) while every
task, inventory variable, limit and failure is Ansible's own. Failures injected: a failing task
(a missing driver package), an unreachable host (SSH to a closed port), a validation failing
after the step.
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuops.actions.ansible import AnsibleExecutor
from gpuops.actions.command import CommandExecutor
from gpuops.model.batch.operation import FleetNode
from gpuops.model.batch.opfile import load_operation
from gpuops.runtime.batch import BatchRecord, BatchStatus, NodeStatus
from gpuops.runtime.facade import Engine
from tests.builders import build_engine
from tests.integration.batch.test_batch_stop import gone
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "batch"
HOSTS = ("n1", "n2", "n3", "n4")
VERSION = "550.54.15"


class Fleet:
    """A fleet whose nodes stay as listed (nothing here drains them)."""

    def __init__(self, nodes: list[FleetNode]) -> None:
        self._nodes = nodes

    def nodes(self) -> list[FleetNode]:
        return self._nodes


def ansible_engine(tmp: Path) -> Engine:
    """An engine with the real ``ansible`` and ``command`` executors, its artifacts in ``tmp``."""
    return build_engine(
        tmp,
        {},
        reload=False,
        executors={"ansible": AnsibleExecutor, "command": CommandExecutor},
        executor_settings={"ansible": {"private_dir": str(tmp / "ansible")}},
    )


def node_root(tmp: Path, host: str) -> Path:
    root = tmp / "roots" / host
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "pkgs").mkdir()
    (root / "driver-version").write_text("535.104.05\n535.104.05\n")
    smi = root / "usr" / "bin" / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat {root}/driver-version\n")
    smi.chmod(0o755)
    if host != "n2":  # n2 lacks the package: the install task fails
        (root / "pkgs" / f"nvidia-driver-{VERSION}").write_text(f"{VERSION}\n{VERSION}\n")
    if host != "n4":  # n4's GPUs do not come back healthy: its validation fails
        (root / "gpu-healthy").write_text("ok\n")
    return root


def inventory(tmp: Path) -> Path:
    lines = [
        "all:",
        "  vars:",
        "    ansible_connection: local",
        f"    ansible_python_interpreter: {sys.executable}",
        "  hosts:",
    ]
    for host in HOSTS:
        root = node_root(tmp, host)
        lines += [
            f"    {host}:",
            f"      nvidia_smi: {root}/usr/bin/nvidia-smi",
            f"      driver_install: [cp, '{root}/pkgs/nvidia-driver-{{{{ driver_version }}}}',"
            f" {root}/driver-version]",
            f"      reboot_command: [touch, {root}/rebooted]",
        ]
        if host == "n3":  # nothing listens on port 1: unreachable
            lines += [
                "      ansible_connection: ssh",
                "      ansible_host: 127.0.0.1",
                "      ansible_port: 1",
            ]
    path = tmp / "inventory.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_driver_upgrade_and_reboot_playbooks_on_four_hosts(tmp_path: Path) -> None:
    inventory(tmp_path)
    for name in ("driver-upgrade.yml", "reboot.yml"):
        (tmp_path / name).write_text((EXAMPLES / name).read_text())
    op_file = tmp_path / "op.yaml"
    op_file.write_text(
        "operation: driver-550\n"
        "targets: {nodes: [n1, n2, n3, n4]}\n"
        "quarantine: none\n"
        "step:\n"
        "  ansible: driver-upgrade.yml\n"
        "  inventory: inventory.yaml\n"
        f"  extra_vars: {{driver_version: '{VERSION}'}}\n"
        "  timeout: 2m\n"
        "reboot: {ansible: reboot.yml}\n"
        "validate:\n"
        f"  command: [test, -e, '{tmp_path}/roots/{{{{ $labels.node }}}}/gpu-healthy']\n"
        "canary: 0\n"
        "max_parallel: 4\n"
        "max_unavailable: 4\n"
        "failure_threshold: 4\n"
        "enforce: true\n"
    )
    operation = load_operation(op_file)
    fleet = Fleet([FleetNode(h, pool="a100", gpus=8) for h in (*HOSTS, "spare")])
    engine = ansible_engine(tmp_path)
    try:
        batch = engine.batches.start(operation, op_file.read_text(), fleet, frozenset(HOSTS))
        rec = engine.batches.run(batch, fleet)
        nodes = engine.batches.nodes(batch)
    finally:
        engine.stop()
    roots = tmp_path / "roots"
    assert rec.status == BatchStatus.DONE and rec.why == "failed: n2, n3, n4", (
        rec.why,
        {n: r.error for n, r in nodes.items()},
    )
    assert nodes["n1"].status == NodeStatus.DONE and nodes["n1"].wave == 0  # one wave
    assert (roots / "n1" / "driver-version").read_text() == f"{VERSION}\n{VERSION}\n"
    assert (roots / "n1" / "rebooted").exists()
    assert nodes["n2"].error.startswith("step: n2: Install the driver package: ")
    assert (roots / "n2" / "driver-version").read_text().startswith("535.104.05")
    assert nodes["n3"].error.startswith("step: n3 unreachable: ")
    assert nodes["n4"].error.startswith("validate: ")
    assert (roots / "n4" / "driver-version").read_text().startswith(VERSION)  # the step ran
    assert (roots / "n4" / "rebooted").exists()
    assert not (roots / "n2" / "rebooted").exists()  # a failed step goes no further
    # each run's artifacts kept under the executor's private_dir, one folder per decision
    assert len(list((tmp_path / "ansible" / "artifacts").iterdir())) == 4 + 2


def test_firmware_playbook_checks_writes_and_reads_back(tmp_path: Path) -> None:
    image = tmp_path / "gpu-fw.bin"
    image.write_bytes(b"\x7fFW" * 1000)
    digest = hashlib.sha256(image.read_bytes()).hexdigest()
    (tmp_path / "inventory.yaml").write_text(
        "all:\n  vars:\n    ansible_connection: local\n"
        f"    ansible_python_interpreter: {sys.executable}\n"
        f"  hosts:\n    f1: {{firmware_dir: {tmp_path}/f1/fw}}\n"
        f"    f2: {{firmware_dir: {tmp_path}/blocker/fw}}\n"
    )
    (tmp_path / "blocker").write_text("a file where f2's folder should be\n")
    (tmp_path / "firmware.yml").write_text((EXAMPLES / "firmware.yml").read_text())
    op_file = tmp_path / "op.yaml"
    op_file.write_text(
        "operation: fw\n"
        "targets: {nodes: [f1, f2]}\n"
        "quarantine: none\n"
        "step:\n"
        "  ansible: firmware.yml\n"
        "  inventory: inventory.yaml\n"
        f"  extra_vars: {{firmware_image: '{image}', firmware_sha256: '{digest}'}}\n"
        "max_parallel: 2\n"
        "canary: 0\n"
        "max_unavailable: 2\n"
        "failure_threshold: 2\n"
        "enforce: true\n"
    )
    fleet = Fleet([FleetNode("f1"), FleetNode("f2"), FleetNode("f3")])
    engine = ansible_engine(tmp_path)
    try:
        batch = engine.batches.start(load_operation(op_file), op_file.read_text(), fleet, None)
        rec = engine.batches.run(batch, fleet)
        nodes = engine.batches.nodes(batch)
    finally:
        engine.stop()
    assert (tmp_path / "f1" / "fw" / "gpu-firmware.bin").read_bytes() == image.read_bytes()
    assert rec.status == BatchStatus.DONE and rec.why == "failed: f2"
    assert nodes["f2"].error.startswith("step: f2: The firmware folder exists: ")


SLOW = """\
- hosts: all
  gather_facts: false
  tasks:
    - name: a long step
      ansible.builtin.shell: "echo $$ > {{ pid_file }}; exec sleep 60"
"""


def test_on_stop_cancel_cancels_the_running_playbook(tmp_path: Path) -> None:
    (tmp_path / "slow.yml").write_text(SLOW)
    (tmp_path / "inventory.yaml").write_text(
        f"all:\n  vars: {{ansible_connection: local, ansible_python_interpreter:"
        f" {sys.executable}}}\n  hosts: {{n1: {{}}}}\n"
    )
    pid_file = tmp_path / "pid"
    op_file = tmp_path / "op.yaml"
    op_file.write_text(
        "operation: slow\ntargets: {nodes: [n1]}\nquarantine: none\n"
        f"step: {{ansible: slow.yml, inventory: inventory.yaml,"
        f" extra_vars: {{pid_file: '{pid_file}'}}}}\n"
        "max_unavailable: 1\nenforce: true\non_stop: cancel\n"
    )
    fleet = Fleet([FleetNode("n1", pool="a100", gpus=8)])
    engine = ansible_engine(tmp_path)
    try:
        batch = engine.batches.start(load_operation(op_file), op_file.read_text(), fleet, None)
        ran: list[BatchRecord] = []
        runner = threading.Thread(target=lambda: ran.append(engine.batches.run(batch, fleet)))
        runner.start()
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 60, "the step")
        sleeping = int(pid_file.read_text())
        engine.set_control("kill_switch", True, "admin")
        asked = time.monotonic()
        runner.join(30)
        took = time.monotonic() - asked
        assert not runner.is_alive(), "the playbook run was not cancelled"
        node = engine.batches.nodes(batch)["n1"]
    finally:
        engine.stop()
        if pid_file.exists() and not gone(int(pid_file.read_text())):
            # ansible-playbook is killed; the task it started on the host runs on, as when
            # Ansible itself is interrupted (its worker's own session)
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert took < 10  # not the task's minute
    assert ran[0].status == BatchStatus.PAUSED and ran[0].why == "the kill switch is on"
    assert (node.status, node.done) == (NodeStatus.RUNNING, [])  # its step runs again
    assert sleeping > 0
