"""The node agent's health events not yet taken by the engine, kept on disk so that they
outlive the agent (a node's reboot, an upgrade, a crash) while the engine is away.

``gpuops.exporters.nvml.push.HealthPusher`` adds each event here before it sends it and
removes it once the engine answered; at its start it reads back what a former agent left, in
order. One file per event (``<sequence>.json``) in the directory: written to a temporary name,
flushed to disk, renamed, and the directory flushed, so that a crash leaves either the whole
event or none of it. A removal lost in a crash sends that event again: the engine knows it by
its id and ignores it. Files only; nothing of HTTP or of the engine.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_NAME = re.compile(r"(\d{12})\.json")
SET_ASIDE = ".unreadable"
"""What an event file that cannot be read is renamed to end with: kept for a person, never
read again."""


class OutboxError(Exception):
    """The directory or an event's file cannot be written."""


class Outbox:
    """The unsent health events under ``directory``, one file each, oldest first."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._next = 1

    def load(self) -> tuple[list[tuple[str, dict[str, Any]]], int]:
        """The events a former agent left, oldest first, each with its file's name; and how
        many files could not be read (each logged and set aside). Creates the directory."""
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            names = sorted(os.listdir(self.directory))
        except OSError as exc:
            raise OutboxError(f"cannot keep health events in {self.directory}: {exc}") from None
        found: list[tuple[str, dict[str, Any]]] = []
        unreadable = 0
        for name in names:
            path = self.directory / name
            if name.startswith(".") and name.endswith(".tmp"):
                log.info("%s: an event whose writing a stop interrupted: removed", path)
                path.unlink(missing_ok=True)
                continue
            match = _NAME.fullmatch(name)
            if match is None:
                continue
            self._next = max(self._next, int(match.group(1)) + 1)
            try:
                event = _read(path)
            except ValueError as exc:
                unreadable += 1
                log.error(
                    "health event file %s cannot be read (%s): set aside as %s%s, not sent",
                    path,
                    exc,
                    name,
                    SET_ASIDE,
                )
                _set_aside(path)
                continue
            found.append((name, event))
        return found, unreadable

    def add(self, event: dict[str, Any]) -> str:
        """Writes ``event`` durably; the name of its file."""
        name = f"{self._next:012d}.json"
        temp = self.directory / f".{name}.tmp"
        try:
            with temp.open("x", encoding="utf-8") as out:
                json.dump(event, out, separators=(",", ":"))
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, self.directory / name)
            self._sync()
        except OSError as exc:
            with contextlib.suppress(OSError):  # a partial file: removed, or skipped at load
                temp.unlink(missing_ok=True)
            raise OutboxError(
                f"cannot write health event {event.get('id')} to {self.directory}: {exc}"
            ) from None
        self._next += 1
        return name

    def remove(self, names: Iterable[str]) -> None:
        """Forgets the events of ``names`` (sent, or dropped)."""
        for name in names:
            try:
                (self.directory / name).unlink(missing_ok=True)
            except OSError as exc:  # sent again at the next start: a duplicate the engine skips
                log.warning("cannot remove the sent health event %s: %s", name, exc)

    def _sync(self) -> None:
        directory = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def _read(path: Path) -> dict[str, Any]:
    """A health event file's event; ``ValueError`` saying why it is not one."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(str(exc)) from None
    try:
        event = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(event, dict):
        raise ValueError(f"not a JSON object but {type(event).__name__}")
    for field in ("id", "node", "kind"):
        if not isinstance(event.get(field), str) or not event[field]:
            raise ValueError(f"no {field!r} (a non-empty string)")
    return event


def _set_aside(path: Path) -> None:
    try:
        os.replace(path, path.with_name(path.name + SET_ASIDE))
    except OSError as exc:
        log.error("cannot set %s aside (%s): it is skipped at each start", path, exc)
