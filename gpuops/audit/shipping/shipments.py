"""What the shipper sends: a sealed segment's entries as one ready ``_bulk`` body
(``Shipment``), sent in runs of its documents (``Run``).

Made by ``gpuops.audit.shipping.shipper.Shipper`` for every sealed segment of the spool
(``load``); the spooled bytes go out as they are. A segment of spool format 2 holds each
document's action line next to it (``gpuops.audit.spool.segments``), so nothing is parsed or
encoded per document; a format 1 segment has each line parsed (orjson) only for its
``event.id`` and data stream, from which its action line is made.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import accumulate, chain, repeat
from operator import add
from pathlib import Path

import orjson

from gpuops.audit.documents import stream_of
from gpuops.audit.lines import action_line
from gpuops.audit.spool.segments import Segment, entry_lines

log = logging.getLogger(__name__)


@dataclass(eq=False)  # by identity
class Shipment:
    """A sealed segment being shipped: its entries as one ready ``_bulk`` body (``data``: each
    document's action line and line), where each entry starts (``starts``: a byte offset per
    document, then the end), and how many of its documents are not yet settled."""

    segment: Segment
    data: bytes = b""
    starts: Sequence[int] = ()
    outstanding: int = 0

    def entry(self, k: int) -> tuple[bytes, bytes]:
        """Document ``k``'s action line and line, without their newlines."""
        action, _, line = self.data[self.starts[k] : self.starts[k + 1] - 1].partition(b"\n")
        return action, line

    def action_field(self, k: int, key: str) -> str:
        """A field of document ``k``'s action line (``_id``, ``_index``): only to report a
        refused document."""
        try:
            return str(orjson.loads(self.entry(k)[0])["create"][key])
        except (ValueError, KeyError, TypeError):
            return "?"


Run = tuple[Shipment, int, int]
"""Documents ``lo`` to ``hi - 1`` of one shipment: a slice of its bytes, sent as it is. The
shipper queues, sizes, sends and counts runs, not documents: a bulk of thousands is a few
slices of the spooled bytes, with no object per document (a tuple per document would cost the
shipper ~4 us each, most of it in the garbage collector). A document refused with a
retryable status is queued again as a run of one."""

_PLUS_TWO = partial(add, 2)


def documents(runs: Iterable[Run]) -> Iterator[tuple[Shipment, int]]:
    """Each document of ``runs``, in order: its shipment and its number."""
    for shipment, lo, hi in runs:
        for k in range(lo, hi):
            yield shipment, k


def size(runs: Iterable[Run]) -> int:
    """The documents of ``runs``."""
    return sum(hi - lo for _, lo, hi in runs)


def count(runs: Iterable[Run], step: int) -> None:
    """Add ``step`` to the outstanding count of each run's shipment, once per document."""
    for shipment, lo, hi in runs:
        shipment.outstanding += step * (hi - lo)


def load(shipment: Shipment) -> int:
    """Read a segment's entries into ``shipment`` (its bytes as they are when well formed,
    which is the rule; else the entries that ``entries`` keeps, joined); their count. The
    offsets of a segment this process wrote are known (``Segment.starts``): its bytes
    are then neither split nor checked."""
    try:
        data = shipment.segment.path.read_bytes()
    except FileNotFoundError:
        return 0
    known = shipment.segment.starts
    if known is not None and known[-1] == len(data) and len(known) > 1:
        shipment.data, shipment.starts = data, known  # written by this process: where they are
        return len(known) - 1
    if shipment.segment.version == 2:  # ready action and document lines
        actions, lines = entry_lines(data, shipment.segment.path)
    else:
        actions, lines = _format_1(data, shipment.segment.path)
    lengths = map(_PLUS_TWO, map(add, map(len, actions), map(len, lines)))
    shipment.starts = list(accumulate(lengths, initial=0))
    if shipment.starts[-1] != len(data):  # lines were skipped (or format 1): join the rest
        pieces = zip(actions, repeat(b"\n"), lines, repeat(b"\n"))
        data = b"".join(chain.from_iterable(pieces))
    shipment.data = data
    return len(actions)


def _format_1(data: bytes, path: Path) -> tuple[list[bytes], list[bytes]]:
    """A format 1 segment's action lines (made from each document's id and data stream)
    and lines."""
    actions: list[bytes] = []
    lines: list[bytes] = []
    pieces = data.split(b"\n")
    for number, line in enumerate(pieces[:-1], start=1):  # the last piece: torn or empty
        try:
            doc = orjson.loads(line)
            doc_id = str(doc["event"]["id"])
        except (ValueError, KeyError, TypeError):
            log.warning("%s: skipping invalid line %d", path, number)
            continue
        actions.append(action_line(stream_of(doc), doc_id)[:-1])
        lines.append(line)
    if pieces[-1]:
        log.warning("%s: skipping torn last line %d", path, len(pieces))
    return actions, lines
