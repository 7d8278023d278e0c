"""``gpuops audit search --help`` names, as its examples, API operations that exist. What the
CLI shows from a running API: tests/integration/api/test_cli_display.py."""

from __future__ import annotations

import re

from click.testing import CliRunner

from gpuops.api.routes import alertmanager, audit, control, decisions, quota, rules
from gpuops.cli import cli


def test_audit_search_help_names_actions_that_exist() -> None:
    text = CliRunner().invoke(cli, ["audit", "search", "--help"]).stdout
    help_line = " ".join(text.split())
    operations = re.search(r"API operation \(([^)]*)\)", help_line)
    assert operations is not None, help_line
    named = {w.strip(" .") for w in operations.group(1).split(",")} - {""}
    routes = {
        r.name
        for module in (alertmanager, audit, control, decisions, quota, rules)
        for r in module.router.routes
    }
    assert named and named <= routes | {"authenticate"}, named - routes
