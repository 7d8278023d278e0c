"""The shipped XID catalogue and a site's overrides: what they hold, what they refuse."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuops.model.health.catalogue import Remedy, Threshold, XidClass
from gpuops.model.health.catalogue_file import (
    load_catalogue,
    parse_catalogue,
    parse_overrides,
    shipped_catalogue,
)
from gpuops.model.rules.model import RulesError

ROOT = Path(__file__).resolve().parents[4]


def test_shipped_catalogue_reads_nvidias_buckets() -> None:
    catalogue = shipped_catalogue()
    assert "NVIDIA Xid Errors" in catalogue.source
    fallen = catalogue.entry(79)
    assert fallen is not None
    assert (fallen.nvidia, fallen.xid_class, fallen.action) == (
        "RESTART_BM",
        XidClass.HARDWARE,
        Remedy.REBOOT_NODE,
    )
    assert fallen.threshold == Threshold(1, 3600.0)
    dbe = catalogue.entry(48)
    assert dbe is not None and dbe.fault_remedy is Remedy.RESET_GPU
    gsp = catalogue.entry(119)
    assert gsp is not None and gsp.xid_class is XidClass.DRIVER
    assert catalogue.entry(63) is not None and catalogue.entry(63).cancels == (94,)  # type: ignore[union-attr]
    assert catalogue.entry(1) is None  # unused on Ampere and newer


def test_no_shipped_application_xid_acts_on_one_event() -> None:
    for entry in shipped_catalogue():
        if entry.xid_class is XidClass.APPLICATION and entry.acts:
            assert entry.threshold is not None and entry.threshold.count >= 2, entry.code
            assert entry.fault_remedy is Remedy.RESET_GPU


def test_override_changes_only_what_it_names() -> None:
    catalogue = shipped_catalogue()
    text = "xids:\n  - code: 45\n    threshold: {count: 30, window: 10m}\n"
    overrides = parse_overrides(text, "site.yaml", catalogue)
    after = catalogue.overridden(overrides, "site.yaml")
    entry = after.entry(45)
    assert entry is not None
    assert entry.threshold == Threshold(30, 600.0)
    assert entry.xid_class is XidClass.APPLICATION and entry.action is Remedy.RESTART_JOB
    assert after.entry(79) == catalogue.entry(79)
    assert after.overridden_by == ("site.yaml",)
    assert catalogue.entry(45).threshold == Threshold(10, 600.0)  # type: ignore[union-attr]


def test_override_threshold_null_stops_a_code_acting() -> None:
    catalogue = shipped_catalogue()
    overrides = parse_overrides("xids:\n  - code: 94\n    threshold: null\n", "s.yaml", catalogue)
    entry = catalogue.overridden(overrides, "s.yaml").entry(94)
    assert entry is not None and entry.threshold is None and not entry.acts


def test_invalid_overrides_name_file_line_and_key() -> None:
    path = ROOT / "tests" / "fixtures" / "health" / "invalid-overrides.yaml"
    expected = (
        (path.with_suffix(".expected"))
        .read_text()
        .replace("tests/fixtures/health/invalid-overrides.yaml", str(path))
    )
    with pytest.raises(RulesError) as caught:
        load_catalogue([path])
    assert "".join(f"{e}\n" for e in caught.value.errors) == expected


def test_application_class_override_cannot_act_on_one_event() -> None:
    text = "xids:\n  - code: 79\n    class: application\n"
    with pytest.raises(RulesError) as caught:
        parse_overrides(text, "s.yaml", shipped_catalogue())
    assert str(caught.value) == (
        "s.yaml:2: xids[0].threshold.count: XID 79 is application-class: it acts past a count "
        "of at least 2 on one GPU, not on one event (found 1; set class: hardware if one event "
        "means a faulty GPU)"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("xids: 3\n", "o.yaml:1: xids: expected a list of XID entries, found 3 (integer)"),
        ("xid: []\n", 'o.yaml:1: xid: unknown key "xid", did you mean "xids"? (allowed: xids)'),
        ("xids:\n\t- code: 1\n", "o.yaml:2: tab character in indentation"),
    ],
)
def test_malformed_override_files(text: str, message: str) -> None:
    with pytest.raises(RulesError) as caught:
        parse_overrides(text, "o.yaml", shipped_catalogue())
    assert str(caught.value.errors[0]).startswith(message)


def test_unreadable_override_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    with pytest.raises(RulesError) as caught:
        load_catalogue([missing])
    assert str(caught.value).startswith(f"{missing}:1: cannot read the XID override file: ")


def test_a_catalogue_listing_a_code_twice_is_refused() -> None:
    entry = (
        "  - {code: 79, mnemonic: M, description: D, nvidia: RESTART_BM, class: hardware, "
        "action: reboot_node}\n"
    )
    with pytest.raises(RulesError) as caught:
        parse_catalogue("xids:\n" + entry + entry, "c.yaml")
    assert (
        str(caught.value) == "c.yaml:3: xids[1].code: XID 79 is listed twice (check lines 2 and 3)"
    )


def test_shipped_example_overrides_load() -> None:
    catalogue = load_catalogue([ROOT / "examples" / "health" / "xid-overrides.yaml"])
    assert catalogue.entry(119).action is Remedy.REBOOT_NODE  # type: ignore[union-attr]
    assert catalogue.entry(45).threshold == Threshold(30, 600.0)  # type: ignore[union-attr]


def test_the_shipped_prometheus_policies_read_the_catalogues_codes() -> None:
    """rules/health/health.yaml names, in PromQL, the codes the catalogue acts on."""
    import re

    from gpuops.model.rules.loader import load_rules

    policies = {p.name: p for p in load_rules([ROOT / "rules" / "health"]).policies()}
    catalogue = shipped_catalogue()

    def codes(policy: str) -> list[set[int]]:
        expr = policies[policy].expr or ""
        found = re.findall(r'xid(?:=~|=)"([0-9|]+)"', expr)
        return [{int(c) for c in group.split("|")} for group in found]

    at_once = {e.code for e in catalogue if e.acts and e.threshold and e.threshold.count == 1}
    assert codes("quarantine-on-hardware-xid") == [at_once, at_once]
    hourly = {
        e.code
        for e in catalogue
        if e.xid_class is XidClass.APPLICATION and e.threshold == Threshold(5, 3600.0)
    }
    assert codes("quarantine-on-repeated-application-xid") == [hourly, {45}]
    assert catalogue.entry(45).threshold == Threshold(10, 600.0)  # type: ignore[union-attr]
