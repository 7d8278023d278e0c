"""Whether an SQLite file can be trusted as a gpuops state file, and ``reset``, which puts one
that cannot aside. A file that cannot be trusted is never reset silently (docs/state.md):
``check_file`` (before SQLite opens it) refuses a missing or an empty file the engine had
written before and a file without the SQLite header; ``check_database`` (once open) a foreign
database and one that fails ``PRAGMA quick_check``. Each raises ``StateError`` naming the file
and what is wrong. Called by ``gpuops.store.sqlite.store``; ``reset`` by ``gpuops state
reset``.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from gpuops.store.errors import StateError, StateFileMissing
from gpuops.store.sqlite.schema import APPLICATION_ID, KNOWN_TABLES

_HEADER = b"SQLite format 3\x00"
_HEADER_SIZE = 100
_INTEGRITY_LINES = 3
"""How many lines of ``quick_check``'s complaints an error quotes."""


def check_file(path: Path, previous_run: str | None) -> None:
    """Refuse, before SQLite opens it, a file that is not a state file: missing or empty
    although the engine ran before, or without the SQLite header."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        if previous_run is not None:  # lost, or not mounted: starting afresh would re-fire
            raise StateFileMissing(
                f"{path}: the state file does not exist but {previous_run}: is the volume that"
                " holds it mounted, and is state_file right? Starting afresh would forget"
                " cooldowns, firing targets and pending approvals and re-fire what already ran."
                " Put the file back (mount its volume) and start again, or, to start afresh on"
                " purpose, run `gpuops state reset`"
            ) from None
        return
    if size == 0:
        if previous_run is not None:
            raise StateError(
                f"{path}: the state file is empty (0 bytes) but {previous_run}: it was truncated"
                " or replaced"
            )
        return
    with path.open("rb") as fh:
        head = fh.read(_HEADER_SIZE)
    if not head.startswith(_HEADER):
        raise StateError(
            f"{path}: not a gpuops state database (no SQLite header: starts with {head[:16]!r})"
        )
    if len(head) < _HEADER_SIZE:
        raise StateError(
            f"{path}: not a gpuops state database (truncated: {size} bytes, shorter than the"
            f" {_HEADER_SIZE}-byte SQLite header)"
        )


def check_database(db: sqlite3.Connection, path: Path) -> None:
    """Refuse a foreign SQLite database (another application's id, or none of our tables)
    and one that fails ``PRAGMA quick_check``."""
    app_id = int(db.execute("PRAGMA application_id").fetchone()[0])
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if app_id not in (0, APPLICATION_ID) or (app_id == 0 and tables and not tables & KNOWN_TABLES):
        found = f"application_id {app_id:#x}" if app_id else f"tables {', '.join(sorted(tables))}"
        raise StateError(f"{path}: not a gpuops state database (an SQLite database with {found})")
    problems = [str(r[0]) for r in db.execute("PRAGMA quick_check")]
    if problems != ["ok"]:
        shown = "; ".join(problems[:_INTEGRITY_LINES])
        more = len(problems) - _INTEGRITY_LINES
        shown += f"; and {more} more" if more > 0 else ""
        raise StateError(f"{path}: corrupt state database (quick_check: {shown}){_size_note(path)}")


def describe(path: Path, exc: sqlite3.DatabaseError) -> str:
    text = str(exc)
    if "not a database" in text:
        return f"not a gpuops state database ({text})"
    return f"corrupt state database ({text}){_size_note(path)}"


def _size_note(path: Path) -> str:
    """ ", truncated: …" when the file is shorter than its header says."""
    try:
        with path.open("rb") as fh:
            head = fh.read(_HEADER_SIZE)
        size = path.stat().st_size
    except OSError:
        return ""
    if len(head) < _HEADER_SIZE:
        return ""
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(head[28:32], "big")
    expected = page_size * pages
    if 0 < size < expected:
        return f", truncated: {size} bytes of the {expected} its header says"
    return ""


def reset(path: Path, now: float | None = None) -> Path | None:
    """Put the state file at ``path`` (and its ``-wal``/``-shm`` files) aside as
    ``NAME.broken-YYYYmmddTHHMMSSZ`` and return the new name (None when there was no file). The
    next open starts afresh. The caller audits it; the engine must not be running."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    aside = path.with_name(f"{path.name}.broken-{stamp}")
    if not path.exists():
        return None
    for suffix in ("-wal", "-shm"):
        extra = path.with_name(path.name + suffix)
        if extra.exists():
            os.replace(extra, aside.with_name(aside.name + suffix))
    os.replace(path, aside)
    return aside
