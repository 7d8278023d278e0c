"""The XID catalogue as values: what an XID code means for a GPU and what gpuops does about it.

Built by ``gpuops.model.health.catalogue_file`` from the shipped ``xids.yaml`` and a site's
override file; read by ``gpuops.model.health.faults`` (which XID events make a GPU faulty) and
the ``gpuops health`` commands. Frozen values only: no I/O here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from types import MappingProxyType


class XidClass(StrEnum):
    """Whose fault an XID usually is."""

    APPLICATION = "application"
    """The job's (an illegal address, a killed process): one event says nothing of the GPU."""
    DRIVER = "driver"
    """The driver's or the GPU's firmware (GSP, a hung micro-controller)."""
    HARDWARE = "hardware"
    """The GPU's, its memory's or its links' (ECC, NVLink, fallen off the bus)."""


class Remedy(StrEnum):
    """What an XID calls for, from nothing to a human with a spare part."""

    NONE = "none"
    """Nothing: the event is recorded only."""
    RESTART_JOB = "restart_job"
    """The job restarts (its scheduler's business); past its threshold the GPU is reset."""
    RESET_GPU = "reset_gpu"
    """The GPU is reset (the node agent), then the node rebooted if that does not heal it."""
    REBOOT_NODE = "reboot_node"
    """The node is rebooted (a reboot covers a reset)."""
    REPLACE = "replace"
    """A human replaces or inspects the part: the node goes straight to needs-human."""


REMEDY_ORDER: tuple[Remedy, ...] = tuple(Remedy)
"""The remedies from least to most: a later one covers every earlier one."""


@dataclass(frozen=True)
class Threshold:
    """``count`` events of one code on one GPU within ``window_s`` seconds make it faulty."""

    count: int
    window_s: float


@dataclass(frozen=True)
class XidEntry:
    """One XID code of the catalogue."""

    code: int
    mnemonic: str
    description: str
    nvidia: str
    """NVIDIA's resolution bucket (immediate action) for the code, as its catalogue names it."""
    xid_class: XidClass
    action: Remedy
    threshold: Threshold | None
    """None: the code never makes a GPU faulty by itself, however often it comes."""
    cancels: tuple[int, ...] = ()
    """Codes whose count on the same GPU an event of this code clears."""

    @property
    def acts(self) -> bool:
        """Whether events of this code can make a GPU faulty."""
        return self.action is not Remedy.NONE and self.threshold is not None

    @property
    def fault_remedy(self) -> Remedy:
        """The first remedy once past the threshold: a GPU that keeps failing its jobs
        (``restart_job``) is reset; the others start where their action says."""
        return Remedy.RESET_GPU if self.action is Remedy.RESTART_JOB else self.action


@dataclass(frozen=True)
class XidOverride:
    """A site's change to one code; None keeps the catalogue's value. ``file``/``line`` say
    where it was written (for messages)."""

    code: int
    file: str
    line: int
    xid_class: XidClass | None = None
    action: Remedy | None = None
    threshold: Threshold | None = None
    clear_threshold: bool = False
    """``threshold: null`` was written: the code never makes a GPU faulty by itself."""
    cancels: tuple[int, ...] | None = None


@dataclass(frozen=True)
class XidCatalogue:
    """The XID codes gpuops knows, by code, and where they came from."""

    source: str
    entries: Mapping[int, XidEntry]
    overridden_by: tuple[str, ...] = ()
    """The override files applied, in order."""

    def entry(self, code: int) -> XidEntry | None:
        return self.entries.get(code)

    def __iter__(self) -> Iterator[XidEntry]:
        return iter(sorted(self.entries.values(), key=lambda e: e.code))

    def __len__(self) -> int:
        return len(self.entries)

    def overridden(self, overrides: tuple[XidOverride, ...], file: str) -> XidCatalogue:
        """This catalogue with ``overrides`` (checked: every code is known) applied."""
        entries = dict(self.entries)
        for o in overrides:
            entry = entries[o.code]
            entries[o.code] = replace(
                entry,
                xid_class=o.xid_class or entry.xid_class,
                action=o.action or entry.action,
                threshold=None if o.clear_threshold else (o.threshold or entry.threshold),
                cancels=entry.cancels if o.cancels is None else o.cancels,
            )
        return XidCatalogue(self.source, MappingProxyType(entries), (*self.overridden_by, file))
