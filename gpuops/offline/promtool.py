"""Checks the PromQL of a rule set with Prometheus' own parser: ``promtool check rules``.

Called by ``gpuops.offline.rulecheck`` (engine reloads, ``gpuops rules check``, the API's
validate) after ``gpuops.model.rules.loader``; it runs a process, so it is not in the pure
model. Every query of every policy (``expr``, ``clear_expr``, ``limits.population``) is written
into a temporary Prometheus rule file, one group per policy; promtool's messages are mapped back
to the policy's ``file:line`` and key. Never a home-made PromQL parser: without promtool this
module says so and checks nothing.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import yaml

from gpuops.model.rules.model import Policy, RuleError, RuleSet

log = logging.getLogger(__name__)

QUERY_KEYS = ("expr", "clear_expr", "population")
_PROMTOOL_LINE = re.compile(r'group "p(?P<index>\d+)", rule \d+, "(?P<key>\w+)": (?P<message>.*)')
_POSITION = re.compile(r"(?P<row>\d+):(?P<column>\d+): (?P<rest>.*)")
_PARSE_PREFIX = "could not parse expression: "


class PromtoolError(RuntimeError):
    """promtool is missing, timed out, or failed in a way that names no policy."""


def find_promtool() -> str:
    """The path of ``promtool``; raises ``PromtoolError`` with what to do when it is missing."""
    path = shutil.which("promtool") or (
        "/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None
    )
    if path is None:
        raise PromtoolError(
            "promtool not found on PATH, so PromQL was not checked: install the Debian package "
            "prometheus (make test does), or skip this check with --no-promql"
        )
    return path


def queries(policy: Policy) -> dict[str, str]:
    """The PromQL queries of ``policy`` by key (``expr``, ``clear_expr``, ``population``)."""
    found = {"expr": policy.expr, "clear_expr": policy.clear_expr, "population": policy.population}
    return {key: query for key, query in found.items() if query}


def check(ruleset: RuleSet, timeout: float = 60.0) -> list[RuleError]:
    """Errors in the PromQL of ``ruleset``, each at its policy's file:line (empty: all valid)."""
    policies = list(ruleset.policies())
    groups = [
        {"name": f"p{index}", "rules": [{"alert": key, "expr": q} for key, q in queries(p).items()]}
        for index, p in enumerate(policies)
        if queries(p)
    ]
    if not groups:
        return []
    promtool = find_promtool()
    with tempfile.TemporaryDirectory(prefix="gpuops-promql-") as tmp:
        path = Path(tmp) / "policies.yaml"
        path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
        try:
            proc = subprocess.run(
                [promtool, "check", "rules", "--lint=none", str(path)],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise PromtoolError(
                f"promtool check rules did not finish within {timeout:.0f}s"
            ) from None
    output = proc.stdout + proc.stderr
    errors = [_error(policies, m) for m in _PROMTOOL_LINE.finditer(output)]
    if proc.returncode != 0 and not errors:
        raise PromtoolError(
            f"promtool check rules failed (exit {proc.returncode}): {output.strip()[-500:]}"
        )
    log.debug("promtool checked %d policies: %d errors", len(groups), len(errors))
    return errors


def _error(policies: list[Policy], match: re.Match[str]) -> RuleError:
    policy = policies[int(match.group("index"))]
    key = match.group("key")
    message = match.group("message").strip()
    message = message.removeprefix(_PARSE_PREFIX)
    file, _, _ = policy.source.rpartition(":")
    if key == "population":
        line = policy.key_lines.get("limits", 0)
        where = f"{policy.path}.limits.population"
    else:
        line = policy.key_lines.get(key, 0)
        where = f"{policy.path}.{key}"
    query = queries(policy).get(key, "")
    position = _POSITION.match(message)
    if "\n" in query and position is not None and line:
        # A multi-line query is a `|` block starting on the line after its key.
        line += int(position.group("row"))
        detail = f"column {position.group('column')}: {position.group('rest')}"
        return RuleError(file, line, f"{where}: invalid PromQL at {detail} (promtool check rules)")
    flat = " ".join(query.split())
    shown = f"'{flat}'" if "'" not in flat else json.dumps(flat)
    return RuleError(
        file, line, f"{where}: invalid PromQL {shown}: {message} (promtool check rules)"
    )
