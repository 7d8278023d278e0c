"""The hosts of an Ansible inventory (INI or YAML, any inventory plugin Ansible enables by
default), read in-process with Ansible's own ``InventoryManager``.

Called by ``gpuops batch plan`` and the batch runner to refuse, before anything runs, an
operation whose targets are not all hosts of its step's inventory.
"""

from __future__ import annotations

from pathlib import Path


class InventoryError(ValueError):
    """An inventory Ansible cannot read."""


def inventory_hosts(path: Path) -> frozenset[str]:
    """The names of every host of the inventory at ``path``."""
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader

    if not path.is_file():
        raise InventoryError(f"inventory {path} not found")
    try:
        manager = InventoryManager(loader=DataLoader(), sources=[str(path)], parse=True)
    except AnsibleError as exc:
        raise InventoryError(f"inventory {path}: {exc}") from None
    hosts = frozenset(h.name for h in manager.get_hosts())
    if not hosts and path.stat().st_size > 0:
        raise InventoryError(f"inventory {path}: Ansible reads no host from it")
    return hosts
