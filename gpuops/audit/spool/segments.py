"""The spool's segments on disk: their names, their two formats, and their entries split.

A spool directory holds ``segment-<seq>`` files, oldest first by sequence number. Format 2
(``segment-<seq>.ndjson``), the one written: each document is two lines, its bulk action
line (``{"create":{"_index":<data stream>,"_id":<event.id>}}``) and its JSON
(``gpuops.audit.lines``), so a segment is a ready Elasticsearch ``_bulk`` body. Format 1
(``segment-<seq>.jsonl``): one JSON document per line, without action lines; such segments
are read, searched and shipped, never written. Readers tell the formats by the file name.
An engine that knows only format 1 cannot read a format 2 segment: ``elk/README.md`` says
how to drain or convert a spool first.

Used by the writer (``gpuops.audit.spool.writer``), the readers
(``gpuops.audit.spool.reader``) and the shipper (``gpuops.audit.shipping``), which sends a
format 2 segment's bytes without parsing them.
"""

from __future__ import annotations

import logging
import re
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from operator import methodcaller
from pathlib import Path

log = logging.getLogger(__name__)

_SEGMENT = re.compile(r"^segment-(\d{12})\.(jsonl|ndjson)$")
ACTION_PREFIX = b'{"create":'
"""How every action line of a format 2 segment starts (no document line does: documents
start with ``{"@timestamp"`` or another field of their own)."""


@dataclass
class Segment:
    """One segment file: its sequence number, documents and size so far."""

    path: Path
    seq: int
    documents: int
    size: int
    opened_at: float = 0.0
    starts: array[int] | None = None
    """Of a segment this process wrote (format 2): the byte offset of each entry, then the
    segment's size, kept as each append is written, so that the shipper need not split and
    check the lines it wrote itself; None when unknown (a segment a previous run left, or one
    whose failed write could not be cut off): the shipper then reads it line by line. 8 bytes
    a document (an ``array``: a 60 s outage at 20,000/s keeps ~10 MB of them)."""

    @property
    def version(self) -> int:
        """The segment's format: 2 (action and document lines), 1 (document lines)."""
        return segment_version(self.path)


def segment_version(path: Path) -> int:
    return 2 if path.suffix == ".ndjson" else 1


def segment_path(directory: Path, seq: int) -> Path:
    """Where the writer puts segment number ``seq`` (format 2)."""
    return directory / f"segment-{seq:012d}.ndjson"


def segment_seq(path: Path) -> int:
    """The sequence number of the segment at ``path`` (one of ``segment_paths``)."""
    return int(path.name[8:20])


def segment_paths(directory: Path) -> list[Path]:
    """The segment files of a spool directory, oldest first."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _SEGMENT.match(p.name))]
    return [p for _, p in sorted(found)]


def entries(data: bytes, path: Path) -> Iterator[tuple[int, bytes, bytes]]:
    """The complete entries of a format 2 segment's bytes: (line number of the action line,
    action line, document line), newlines cut off. A torn last entry (a process killed while
    writing, never acknowledged) and a line out of place are skipped with a warning.

    A document line is checked only as far as it costs nothing: it must start with ``{`` and
    not be an action line (a corrupt line, e.g. a disk block of zeros, is skipped with its
    action; an action line followed by another action line lost its document and is skipped
    alone). A line that starts well but is not JSON is sent all the same: Elasticsearch refuses
    it and the shipper dead-letters its bytes."""
    lines = data.split(b"\n")
    torn = lines.pop()  # b"" when the segment ends with a newline
    i, n = 0, len(lines)
    while i < n:
        action = lines[i]
        if not action.startswith(ACTION_PREFIX):
            log.warning("%s: skipping invalid line %d", path, i + 1)
            i += 1
            continue
        if i + 1 == n:
            torn = torn or action
            break
        line = lines[i + 1]
        if not line.startswith(b"{"):
            log.warning("%s: skipping invalid document line %d", path, i + 2)
            i += 2
            continue
        if line.startswith(ACTION_PREFIX):
            log.warning("%s: skipping action line %d without its document", path, i + 1)
            i += 1
            continue
        yield i + 1, action, line
        i += 2
    if torn:
        log.warning("%s: skipping torn last entry at line %d (never acknowledged)", path, i + 1)


_IS_ACTION = methodcaller("startswith", ACTION_PREFIX)
_IS_OBJECT = methodcaller("startswith", b"{")


def entry_lines(data: bytes, path: Path) -> tuple[list[bytes], list[bytes]]:
    """The action lines and the document lines of ``entries(data, path)``, as two lists. A
    well-formed segment (the common case: every other line an action line, the others
    objects, a newline at the end) is checked and split in C; any other goes through
    ``entries``, which skips and reports what is out of place."""
    lines = data.split(b"\n")
    if not lines[-1] and len(lines) % 2:
        actions, docs = lines[0:-1:2], lines[1::2]
        if (
            all(map(_IS_ACTION, actions))
            and all(map(_IS_OBJECT, docs))
            and not any(map(_IS_ACTION, docs))
        ):
            return actions, docs
    found = list(entries(data, path))
    return [action for _, action, _ in found], [doc for _, _, doc in found]
