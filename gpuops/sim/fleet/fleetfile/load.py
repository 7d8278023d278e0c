"""Loading a fleet file: read, parse with positions, validate against the schema, check across
sections, and build the ``FleetConfig``; every problem reported as ``file:line: key: what``.

Called through ``gpuops.sim.fleet.fleetfile`` by ``gpuops fleet sim --fleet FILE``
(``gpuops.cli.fleet``), the what-if's command and tests.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import ValidationError

from gpuops.sim.fleet.config import FleetConfig
from gpuops.sim.fleet.fleetfile.build import config
from gpuops.sim.fleet.fleetfile.checks import cross_check
from gpuops.sim.fleet.fleetfile.positions import Reader
from gpuops.sim.fleet.fleetfile.schema import _FleetFile


class FleetFileError(Exception):
    """The fleet file cannot be used; one line per problem, each naming file, line and key."""


def load_fleet(path: Path) -> FleetConfig:
    """Read and validate a fleet file into a ``FleetConfig`` (listeners at their defaults)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise FleetFileError(f"{path}: cannot read: {exc.strerror}") from exc
    return parse_fleet(text, str(path))


def parse_fleet(text: str, source: str = "<fleet>") -> FleetConfig:
    for number, text_line in enumerate(text.splitlines(), start=1):
        if re.match(r"^ *\t", text_line):
            raise FleetFileError(
                f"{source}:{number}: tab character in indentation (YAML indents with spaces)"
            )
    reader = Reader()
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = {} if root is None else reader.read(root, ())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise FleetFileError(f"{source}:{line}: YAML syntax error: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise FleetFileError(f"{source}:1: YAML syntax error: {exc}") from None
    if reader.problems:
        raise FleetFileError("\n".join(f"{source}:{n}: {m}" for n, m in reader.problems))
    if not isinstance(data, dict):
        raise FleetFileError(f"{source}:1: a fleet file is a mapping (name, pools, ...)")
    try:
        doc = _FleetFile.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = tuple(p for p in err["loc"] if isinstance(p, str | int))
            where = ".".join(str(p) for p in loc)
            message = str(err["msg"]).removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                message = "unknown key"
            problems.append(f"{source}:{reader.line(loc)}: {where}: {message}")
        raise FleetFileError("\n".join(problems)) from None
    problems = [
        f"{source}:{reader.line(loc)}: {'.'.join(str(p) for p in loc)}: {message}"
        for loc, message in cross_check(doc)
    ]
    if problems:
        raise FleetFileError("\n".join(problems))
    return config(doc)
