"""The documents of a spool, read back without its writer lock (read-only).

Called by ``gpuops audit search`` (``gpuops.audit.search.SpoolBackend``) when no
Elasticsearch is configured, by the demo and by tests; the writer
(``gpuops.audit.spool.writer``) counts the documents a previous run left with
``count_documents``. A torn or invalid line (a crash mid-write) is skipped with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from gpuops.audit.spool.segments import entries, entry_lines, segment_paths, segment_version

log = logging.getLogger(__name__)


def read_segment(path: Path) -> Iterator[dict[str, Any]]:
    """The documents of one segment; a torn or invalid line (a crash mid-write) is skipped."""
    if segment_version(path) == 2:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        for number, _, line in entries(data, path):
            try:
                doc = orjson.loads(line)
            except ValueError:  # orjson.JSONDecodeError is a ValueError
                log.warning("%s: skipping invalid line %d", path, number + 1)
                continue
            if isinstance(doc, dict):
                yield doc
        return
    try:
        with path.open("rb") as fh:
            for number, raw in enumerate(fh, start=1):
                if not raw.endswith(b"\n"):
                    log.warning("%s: skipping torn last line %d (never acknowledged)", path, number)
                    return
                try:
                    doc = orjson.loads(raw)
                except ValueError:  # orjson.JSONDecodeError is a ValueError
                    log.warning("%s: skipping invalid line %d", path, number)
                    continue
                if isinstance(doc, dict):
                    yield doc
    except FileNotFoundError:
        return


def count_documents(path: Path) -> int:
    """The documents of a segment a previous run left (format 2: its complete entries, not
    parsed)."""
    if segment_version(path) == 2:
        return len(entry_lines(path.read_bytes(), path)[0])
    return sum(1 for _ in read_segment(path))


def read_spool(directory: Path) -> Iterator[dict[str, Any]]:
    """Every document of a spool directory, oldest segment first (no lock: read-only)."""
    for path in segment_paths(directory):
        yield from read_segment(path)
