"""A batch operation running the shipped playbooks for real (ansible-runner, ansible-playbook)
against several hosts of this machine, each host a local connection to a root folder of its
own — the cheapest way to give many hosts their own files (no sshd, no namespaces) while every
task, inventory variable, limit and failure is Ansible's own. Failures injected: a failing task
(a missing driver package), an unreachable host (SSH to a closed port), a validation failing
after the step.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from gpuops.actions.ansible import AnsibleExecutor
from gpuops.actions.command import CommandExecutor
from gpuops.model.batch.operation import FleetNode
from gpuops.model.batch.opfile import load_operation
from gpuops.runtime.batch import BatchStatus, NodeStatus
from gpuops.runtime.facade import Engine
from tests.builders import build_engine

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
