"""The order in which queued alerts are decided: the smallest notification first, each alert's
own notifications in the order they came.

Filled by ``gpuops.runtime.alerts.inbox.AlertInbox`` (a notification's alerts as one group, by
their inbox item ids) and emptied by its worker, ``BATCH`` alerts at a time. Not locked itself:
the inbox calls it holding its lock.
"""

from __future__ import annotations

import bisect
import heapq
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import count

from gpuops.model.alerts import Alert

Queued = tuple[int, Alert]
"""An alert waiting to be decided, with the id of its inbox item."""


@dataclass(eq=False)
class _Group:
    """One notification's alerts not taken yet (inbox item -> alert), in arrival order."""

    seq: int
    alerts: OrderedDict[int, Alert]


class Waiting:
    """The queued alerts, by notification. ``take`` hands out those of the group with the
    fewest left first (of two the same size, the older): a notification of a few alerts — a
    GPU fell off the bus — waits for at most the batch being decided, not for a group of
    thousands. Smallest first, rather than a queue per receiver or per policy: one receiver
    sends large and small groups alike, the policies an alert triggers are known only once it
    is decided, and what makes a notification wait long is the size of those before it. An
    alert's own notifications stay in order: taking one takes first its older ones still
    waiting (the same fingerprint) from whatever group holds them, so an older event of an
    alert is never decided after a newer one (a firing after its resolve, or after its next
    episode)."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, _Group]] = []  # (alerts left when pushed, seq, group)
        self._seq = count()
        self._group: dict[int, _Group] = {}  # item -> the group holding it
        self._lines: dict[str, list[int]] = {}  # fingerprint -> its items waiting, oldest first

    def __len__(self) -> int:
        return len(self._group)

    def add(self, alerts: Sequence[Queued]) -> None:
        group = _Group(next(self._seq), OrderedDict(alerts))
        for item, alert in group.alerts.items():
            self._group[item] = group
            bisect.insort(self._lines.setdefault(alert.fingerprint, []), item)
        heapq.heappush(self._heap, (len(group.alerts), group.seq, group))

    def take(self, most: int) -> list[Queued]:
        """Up to ``most`` alerts (a few more where older notifications of theirs come along)."""
        taken: list[Queued] = []
        while len(taken) < most and self._heap:
            left, seq, group = self._heap[0]
            if left != len(group.alerts):  # it shrank since: its place by what it has left
                heapq.heappop(self._heap)
                if group.alerts:
                    heapq.heappush(self._heap, (len(group.alerts), seq, group))
                continue
            self._take(next(iter(group.alerts)), taken)
        return taken

    def _take(self, item: int, taken: list[Queued]) -> None:
        """Take ``item``, after the older items of its alert still waiting."""
        fingerprint = self._group[item].alerts[item].fingerprint
        line = self._lines[fingerprint]
        upto = line.index(item) + 1
        for older in line[:upto]:
            taken.append((older, self._group.pop(older).alerts.pop(older)))
        del line[:upto]
        if not line:
            del self._lines[fingerprint]
