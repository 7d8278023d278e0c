"""A node's name limits a playbook run to that one host of the inventory: a name that is a
pattern, a group, or no host of the inventory (``localhost``) fails before anything runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuops.actions import ansible
from gpuops.actions.ansible import AnsibleExecutor
from gpuops.actions.base import PermanentError
from tests.unit.actions.support import make_decision

INVENTORY = """\
[gpus]
gpu-01
gpu-02
gpu-03
"""


@pytest.mark.parametrize(
    ("node", "said"),
    [
        ("gpu-0?", "is not a host name"),
        ("@hosts.txt", "is not a host name"),
        ("gpus", "is a group of inventory"),
        ("all", "is a group of inventory"),
        ("localhost", "is no host of inventory"),
        ("127.0.0.1", "is no host of inventory"),
    ],
)
def test_a_node_name_runs_on_its_one_host_or_nothing_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, node: str, said: str
) -> None:
    (tmp_path / "hosts.ini").write_text(INVENTORY)
    (tmp_path / "hosts.txt").write_text("gpu-01\ngpu-02\n")
    (tmp_path / "step.yml").write_text("- hosts: all\n  tasks: []\n")
    ran: list[dict[str, Any]] = []
    monkeypatch.setattr(ansible, "run_playbook", lambda **kw: ran.append(kw))
    params = {"playbook": str(tmp_path / "step.yml"), "inventory": str(tmp_path / "hosts.ini")}
    decision = make_decision("run_playbook", "ansible", params, node=node)
    with pytest.raises(PermanentError, match=said):
        AnsibleExecutor({"private_dir": str(tmp_path / "runs")}).run(decision)
    assert ran == []
