"""XID catalogue files to an ``XidCatalogue``, every problem as ``FILE:LINE: where: what``.

Reads the catalogue shipped in this package (``xids.yaml``) and a site's override files, with
the rule files' YAML reader (``gpuops.model.rules.yamlsource``: lines, duplicate keys, limits)
and their error type (``RuleError``), so ``gpuops health check`` prints them as ``gpuops rules
check`` does. Called by the settings (``health.xid_overrides``) and ``gpuops.cli.health``.

An override names a known code and changes its ``class``, ``action``, ``threshold`` or
``cancels``; an unknown code, class or action is refused, and so is an application-class code
that would act on one event (``threshold.count`` below 2): a job's own fault never takes a
GPU out by itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpuops.model.health.catalogue import (
    Remedy,
    Threshold,
    XidCatalogue,
    XidClass,
    XidEntry,
    XidOverride,
)
from gpuops.model.rules.durations import DurationError, parse_duration
from gpuops.model.rules.messages import from_yaml, located, unknown_key
from gpuops.model.rules.model import RuleError, RulesError
from gpuops.model.rules.schema import describe, suggest
from gpuops.model.rules.yamlsource import Positions, YamlPath, parse_yaml

SHIPPED = "xids.yaml"
"""The shipped catalogue, a file of this package."""
_ENTRY_KEYS = ("action", "cancels", "class", "code", "description", "mnemonic", "nvidia")
_OVERRIDE_KEYS = ("action", "cancels", "class", "code", "note", "threshold")
_THRESHOLD_KEYS = ("count", "window")


class _Reader:
    """Reads one file's entries, collecting every problem with its line."""

    def __init__(self, file: str, positions: Positions) -> None:
        self.file = file
        self.positions = positions
        self.errors: list[RuleError] = []

    def fail(self, path: YamlPath, message: str, value_line: bool = True) -> None:
        line = self.positions.value_line(path) if value_line else self.positions.line(path)
        self.errors.append(located(self.file, line, path, message))

    def mapping(self, data: Any, path: YamlPath, allowed: Sequence[str]) -> Mapping[str, Any]:
        if not isinstance(data, dict):
            self.fail(path, f"expected a mapping, found {describe(data)}")
            return {}
        for key in data:
            if key not in allowed:
                self.fail((*path, str(key)), unknown_key(str(key), sorted(allowed)), False)
        return data

    def choice(self, data: Mapping[str, Any], path: YamlPath, key: str, enum: Any) -> Any:
        value = data[key]
        allowed = [e.value for e in enum]
        if value not in allowed:
            found = describe(value)
            self.fail(
                (*path, key),
                f"unknown {key} {found}{suggest(value, allowed)} (allowed: {', '.join(allowed)})",
            )
            return None
        return enum(value)

    def code(self, value: Any, path: YamlPath, known: Mapping[int, Any] | None) -> int | None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            self.fail(path, f"an XID code is a whole number, found {describe(value)}")
            return None
        if known is not None and value not in known:
            self.fail(
                path,
                f"unknown XID {value}: the catalogue has no such code (see `gpuops health "
                "xids`; an override changes a known code only)",
            )
            return None
        return value

    def threshold(self, value: Any, path: YamlPath) -> Threshold | None:
        data = self.mapping(value, path, _THRESHOLD_KEYS)
        if not data:
            return None
        count = data.get("count")
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            self.fail(
                (*path, "count"),
                f"expected a whole number of at least 1, found "
                f"{describe(count) if 'count' in data else 'nothing'}",
            )
            count = None
        window = data.get("window")
        seconds = _seconds(window)
        if seconds is None:
            found = describe(window) if "window" in data else "nothing"
            self.fail(
                (*path, "window"),
                f"expected a duration above 0 such as 10m or 24h, found {found}",
            )
        if count is None or seconds is None:
            return None
        return Threshold(count, seconds)

    def cancels(
        self, value: Any, path: YamlPath, known: Mapping[int, Any], own: int | None
    ) -> tuple[int, ...] | None:
        if not isinstance(value, list):
            self.fail(path, f"expected a list of XID codes, found {describe(value)}")
            return None
        codes = [self.code(v, (*path, i), known) for i, v in enumerate(value)]
        if own is not None and own in codes:
            self.fail(path, f"XID {own} cannot cancel itself")
            return None
        return tuple(c for c in codes if c is not None) if None not in codes else None


def _seconds(window: Any) -> float | None:
    """A duration above 0 in seconds, or None."""
    if not isinstance(window, str):
        return None
    try:
        seconds = parse_duration(window)
    except DurationError:
        return None
    return seconds if seconds > 0 else None


def _document(text: str, file: str) -> tuple[Any, _Reader]:
    data, positions, problems = parse_yaml(text)
    reader = _Reader(file, positions)
    reader.errors.extend(from_yaml(file, p) for p in problems)
    return data, reader


def _items(data: Any, reader: _Reader, top: Sequence[str]) -> list[tuple[YamlPath, Any]]:
    if data is None and reader.errors:
        return []  # unreadable: the YAML problem says why
    root = reader.mapping(data if data is not None else {}, (), top)
    xids = root.get("xids")
    if not isinstance(xids, list):
        reader.fail(
            ("xids",),
            f"expected a list of XID entries, found "
            f"{describe(xids) if 'xids' in root else 'nothing'}",
        )
        return []
    return [(("xids", i), item) for i, item in enumerate(xids)]


def _check_class(reader: _Reader, path: YamlPath, entry: XidEntry) -> None:
    """An application-class code never makes a GPU faulty on one event."""
    if entry.xid_class is XidClass.APPLICATION and entry.acts and entry.threshold is not None:
        if entry.threshold.count < 2:
            reader.fail(
                (*path, "threshold", "count"),
                f"XID {entry.code} is application-class: it acts past a count of at least 2 on "
                f"one GPU, not on one event (found {entry.threshold.count}; set class: "
                "hardware if one event means a faulty GPU)",
            )


def parse_catalogue(text: str, file: str) -> XidCatalogue:
    """A whole catalogue (the shipped one); ``RulesError`` lists every problem."""
    data, reader = _document(text, file)
    entries: dict[int, XidEntry] = {}
    seen: dict[int, int] = {}
    cancelling: list[tuple[YamlPath, int, Any]] = []
    for path, item in _items(data, reader, ("source", "xids")):
        fields = reader.mapping(item, path, (*_ENTRY_KEYS, "threshold"))
        missing = [k for k in _ENTRY_KEYS if k not in fields and k != "cancels"]
        if fields and missing:
            reader.fail(path, f"missing {', '.join(missing)}")
            continue
        if not fields:
            continue
        code = reader.code(fields["code"], (*path, "code"), None)
        xid_class = reader.choice(fields, path, "class", XidClass)
        action = reader.choice(fields, path, "action", Remedy)
        threshold = (
            reader.threshold(fields["threshold"], (*path, "threshold"))
            if fields.get("threshold") is not None
            else None
        )
        if code is None or xid_class is None or action is None:
            continue
        if code in seen:
            first = seen[code]
            reader.fail(
                (*path, "code"),
                f"XID {code} is listed twice (check lines {first} and "
                f"{reader.positions.value_line((*path, 'code'))})",
            )
            continue
        seen[code] = reader.positions.value_line((*path, "code"))
        entry = XidEntry(
            code,
            str(fields["mnemonic"]),
            str(fields["description"]),
            str(fields["nvidia"]),
            xid_class,
            action,
            threshold,
        )
        _check_class(reader, path, entry)
        entries[code] = entry
        if "cancels" in fields:
            cancelling.append((path, code, fields["cancels"]))
    # cancels name other codes of the same file: read once every code is known
    for path, code, value in cancelling:
        codes = reader.cancels(value, (*path, "cancels"), entries, code)
        if codes is not None:
            entries[code] = replace(entries[code], cancels=codes)
    if reader.errors:
        raise RulesError(sorted(reader.errors, key=lambda e: e.line))
    source = data.get("source", file) if isinstance(data, dict) else file
    return XidCatalogue(str(source), MappingProxyType(entries))


def parse_overrides(text: str, file: str, catalogue: XidCatalogue) -> tuple[XidOverride, ...]:
    """A site's override file, checked against ``catalogue``; ``RulesError`` lists every
    problem."""
    data, reader = _document(text, file)
    overrides: list[XidOverride] = []
    seen: dict[int, int] = {}
    for path, item in _items(data, reader, ("xids",)):
        fields = reader.mapping(item, path, _OVERRIDE_KEYS)
        if not fields:
            continue
        if "code" not in fields:
            reader.fail(path, "missing code (the XID this entry changes)")
            continue
        code = reader.code(fields["code"], (*path, "code"), catalogue.entries)
        if code is None:
            continue
        line = reader.positions.value_line((*path, "code"))
        if code in seen:
            reader.fail(
                (*path, "code"),
                f"XID {code} is overridden twice (check lines {seen[code]} and {line})",
            )
            continue
        seen[code] = line
        before = len(reader.errors)
        xid_class = reader.choice(fields, path, "class", XidClass) if "class" in fields else None
        action = reader.choice(fields, path, "action", Remedy) if "action" in fields else None
        threshold = None
        if fields.get("threshold") is not None:
            threshold = reader.threshold(fields["threshold"], (*path, "threshold"))
        cancels = None
        if "cancels" in fields:
            cancels = reader.cancels(fields["cancels"], (*path, "cancels"), catalogue.entries, code)
        if len(reader.errors) > before:
            continue
        override = XidOverride(
            code,
            file,
            line,
            xid_class,
            action,
            threshold,
            "threshold" in fields and fields["threshold"] is None,
            cancels,
        )
        _check_class(reader, path, catalogue.overridden((override,), file).entries[code])
        overrides.append(override)
    if reader.errors:
        raise RulesError(sorted(reader.errors, key=lambda e: e.line))
    return tuple(overrides)


@cache
def shipped_catalogue() -> XidCatalogue:
    """The catalogue shipped with gpuops (a broken one is a bug of the package: it raises).
    Read once per process (~0.1-0.3 s of YAML with line marks; the value is frozen)."""
    text = resources.files(__package__).joinpath(SHIPPED).read_text(encoding="utf-8")
    return parse_catalogue(text, f"gpuops/model/health/{SHIPPED}")


def load_catalogue(overrides: Sequence[Path] = ()) -> XidCatalogue:
    """The shipped catalogue with the site's override files applied in order; ``RulesError``
    names every problem of every file (``FILE:LINE``)."""
    catalogue = shipped_catalogue()
    errors: list[RuleError] = []
    for path in overrides:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            errors.append(RuleError(str(path), 1, f"cannot read the XID override file: {exc}"))
            continue
        try:
            catalogue = catalogue.overridden(parse_overrides(text, str(path), catalogue), str(path))
        except RulesError as exc:
            errors.extend(exc.errors)
    if errors:
        raise RulesError(errors)
    return catalogue
