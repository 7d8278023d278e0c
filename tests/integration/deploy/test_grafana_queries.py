"""The Grafana dashboards against a real Prometheus.

Every PromQL expression of every panel target and template variable of ``grafana/dashboards``
runs against a real Prometheus scraping the simulated fleet: each must be accepted, and the GPU
fleet dashboard's must also return data. Every datasource a dashboard names must be provisioned
in ``grafana/provisioning``, every ``$variable`` used must be defined, and the fields of the
Elasticsearch annotations must be mapped by ``elk/``. The self-checks at the end feed broken
dashboards through the same checks and expect them to fail.
"""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from gpuops.sim.fleet import FleetConfig, FleetSim
from gpuops.sources.promproc import PrometheusServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
DASHBOARD_DIR = REPO / "grafana" / "dashboards"
DATASOURCES_FILE = REPO / "grafana" / "provisioning" / "datasources" / "datasources.yaml"
ECS_TEMPLATES = REPO / "elk" / "elasticsearch" / "component_templates"
FLEET_DASHBOARD = "gpu-fleet.json"
"""Its queries read only fleet series, so on a scraped fleet every one must return data."""

# What Grafana puts in place of its own variables, and of ours (all of them are multi-value
# regex variables: "All" is ".*").
BUILTINS = {
    "__rate_interval": "1m",
    "__interval": "1m",
    "__interval_ms": "60000",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
}
ALL_VALUE = ".*"
VARIABLE = re.compile(r"\$\{(\w+)(?::[\w-]+)?\}|\[\[(\w+)(?::[\w-]+)?\]\]|\$(\w+)")
LABEL_VALUES = re.compile(r"^\s*label_values\((?:(?P<expr>.*),)?\s*(?P<label>\w+)\s*\)\s*$", re.S)
QUERY_RESULT = re.compile(r"^\s*query_result\((?P<expr>.*)\)\s*$", re.S)
LUCENE_FIELD = re.compile(r"(?<![\w.@])([@\w][\w.]*):")


@dataclass(frozen=True)
class Query:
    """One PromQL expression of a dashboard, where it is, and (variables) the label it lists."""

    dashboard: str
    where: str
    expr: str
    label: str | None = None

    def __str__(self) -> str:
        return f"{self.dashboard}: {self.where}"


def load_dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARD_DIR.glob("*.json"))}


def provisioned_datasources() -> dict[str, str]:
    """uid → type of every provisioned datasource."""
    doc = yaml.safe_load(DATASOURCES_FILE.read_text())
    return {ds["uid"]: ds["type"] for ds in doc["datasources"]}


def walk_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel, the ones inside (collapsed) rows included."""
    for panel in panels:
        yield panel
        yield from walk_panels(panel.get("panels", []))


def datasource_refs(dashboard: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, datasource reference) of every panel, target, variable and annotation."""
    for panel in walk_panels(dashboard.get("panels", [])):
        title = panel.get("title", "?")
        if panel.get("type") != "row" and "datasource" in panel:
            yield f"panel {title!r}", panel["datasource"]
        for target in panel.get("targets", []):
            if "datasource" in target:
                yield f"panel {title!r} target {target.get('refId')}", target["datasource"]
    for variable in dashboard.get("templating", {}).get("list", []):
        if "datasource" in variable:
            yield f"variable {variable['name']}", variable["datasource"]
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if not annotation.get("builtIn"):
            yield f"annotation {annotation['name']!r}", annotation["datasource"]


def datasource_problems(name: str, dashboard: dict[str, Any], known: dict[str, str]) -> list[str]:
    problems = []
    for where, ref in datasource_refs(dashboard):
        if not isinstance(ref, dict) or "uid" not in ref:
            problems.append(f"{name}: {where}: datasource {ref!r} is not a {{type, uid}} reference")
        elif ref["uid"] not in known:
            problems.append(f"{name}: {where}: datasource uid {ref['uid']!r} is not provisioned")
        elif ref.get("type", known[ref["uid"]]) != known[ref["uid"]]:
            problems.append(
                f"{name}: {where}: datasource {ref['uid']!r} is {known[ref['uid']]}, "
                f"not {ref['type']}"
            )
    return problems


def prometheus_queries(name: str, dashboard: dict[str, Any], known: dict[str, str]) -> list[Query]:
    """Every PromQL expression of the dashboard's Prometheus targets and query variables."""

    def is_prometheus(*refs: Any) -> bool:
        ref = next((r for r in refs if r), None)
        return isinstance(ref, dict) and known.get(ref.get("uid", "")) == "prometheus"

    queries = []
    for panel in walk_panels(dashboard.get("panels", [])):
        for target in panel.get("targets", []):
            if is_prometheus(target.get("datasource"), panel.get("datasource")):
                where = f"panel {panel.get('title')!r} target {target.get('refId')}"
                queries.append(Query(name, where, target.get("expr", "")))
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query" or not is_prometheus(variable.get("datasource")):
            continue
        raw = variable.get("query")
        text = raw.get("query", "") if isinstance(raw, dict) else str(raw)
        where = f"variable {variable['name']}"
        if m := LABEL_VALUES.match(text):
            queries.append(Query(name, where, m["expr"] or "up", m["label"]))
        elif m := QUERY_RESULT.match(text):
            queries.append(Query(name, where, m["expr"]))
        else:
            queries.append(Query(name, where, text))
    return queries


def substitute(expr: str, defined: set[str]) -> tuple[str, list[str]]:
    """``expr`` with Grafana's variables replaced, and the names used but not defined."""
    unknown: list[str] = []

    def value(m: re.Match[str]) -> str:
        var = m[1] or m[2] or m[3]
        if var in BUILTINS:
            return BUILTINS[var]
        if var not in defined:
            unknown.append(var)
        return ALL_VALUE

    return VARIABLE.sub(value, expr), unknown


def defined_variables(dashboard: dict[str, Any]) -> set[str]:
    return {v["name"] for v in dashboard.get("templating", {}).get("list", [])}


def run_query(prom_url: str, expr: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(error or None, result) of an instant query."""
    r = requests.get(f"{prom_url}/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    if body.get("status") != "success":
        return f"{body.get('errorType')}: {body.get('error')}", []
    result = body["data"]["result"]
    return None, result if isinstance(result, list) else [result]


def query_problems(
    prom_url: str,
    name: str,
    dashboard: dict[str, Any],
    known: dict[str, str],
    need_data: bool,
    data_timeout: float = 60.0,
) -> list[str]:
    """What is wrong with the dashboard's queries: undefined variables, queries Prometheus
    refuses and, with ``need_data``, queries that return nothing (or lack the variable's label)
    once the fleet has been scraped (polled until a deadline)."""
    defined = defined_variables(dashboard)
    problems: list[str] = []
    pending: dict[Query, str] = {}
    for query in prometheus_queries(name, dashboard, known):
        if not query.expr.strip():
            problems.append(f"{query}: empty expression")
            continue
        expr, unknown = substitute(query.expr, defined)
        problems += [f"{query}: ${var} is not a variable of the dashboard" for var in unknown]
        error, _ = run_query(prom_url, expr)
        if error:
            problems.append(f"{query}: Prometheus refuses {expr!r}: {error}")
        elif need_data:
            pending[query] = expr
    deadline = time.monotonic() + data_timeout
    while pending:
        for query, expr in list(pending.items()):
            _, result = run_query(prom_url, expr)
            if result and (query.label is None or any(query.label in s["metric"] for s in result)):
                del pending[query]
        if not pending or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for query, expr in pending.items():
        wanted = f"series with label {query.label!r}" if query.label else "data"
        problems.append(f"{query}: no {wanted} from {expr!r} on the scraped fleet")
    return problems


def mapped_fields() -> set[str]:
    """Every field the ECS and gpuops component templates map (dotted paths)."""
    fields: set[str] = set()

    def walk(properties: dict[str, Any], prefix: str) -> None:
        for key, spec in properties.items():
            fields.add(prefix + key)
            walk(spec.get("properties", {}), f"{prefix}{key}.")

    for path in ECS_TEMPLATES.glob("*.json"):
        mappings = json.loads(path.read_text()).get("template", {}).get("mappings", {})
        walk(mappings.get("properties", {}), "")
    return fields


def annotation_problems(name: str, dashboard: dict[str, Any], known: dict[str, str]) -> list[str]:
    """Elasticsearch annotations: a query, and only fields the audit templates map."""
    fields = mapped_fields()
    problems = []
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if known.get(annotation.get("datasource", {}).get("uid", "")) != "elasticsearch":
            continue
        where = f"{name}: annotation {annotation['name']!r}"
        query = annotation.get("target", {}).get("query") or annotation.get("query")
        if not query:
            problems.append(f"{where}: no query")
            continue
        used = set(LUCENE_FIELD.findall(query))
        used |= {annotation[k] for k in ("timeField", "textField", "tagsField") if k in annotation}
        problems += [f"{where}: field {f!r} is not mapped by elk/" for f in sorted(used - fields)]
    return problems


def structure_problems(name: str, dashboard: dict[str, Any]) -> list[str]:
    problems = []
    for key in ("uid", "title", "schemaVersion", "panels"):
        if key not in dashboard:
            problems.append(f"{name}: no {key!r}")
    if not 0 < len(dashboard.get("uid", "")) <= 40:
        problems.append(f"{name}: uid must have 1 to 40 characters")
    if dashboard.get("schemaVersion", 0) < 36:
        problems.append(f"{name}: schemaVersion {dashboard.get('schemaVersion')} is before 36")
    ids = [p.get("id") for p in walk_panels(dashboard.get("panels", []))]
    if len(ids) != len(set(ids)) or None in ids:
        problems.append(f"{name}: panel ids must be unique and set: {ids}")
    for panel in walk_panels(dashboard.get("panels", [])):
        pos = panel.get("gridPos", {})
        if not {"h", "w", "x", "y"} <= pos.keys() or pos["x"] + pos["w"] > 24:
            problems.append(
                f"{name}: panel {panel.get('title')!r}: gridPos {pos} is not in 24 columns"
            )
        if panel.get("type") != "row" and not panel.get("targets"):
            problems.append(f"{name}: panel {panel.get('title')!r} has no targets")
    return problems


# ── the dashboards ────────────────────────────────────────────────────────────────────────────

DASHBOARDS = load_dashboards()


@pytest.fixture(scope="module")
def known() -> dict[str, str]:
    return provisioned_datasources()


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir: Path = tmp_path_factory.mktemp("grafana-prom")
    config = FleetConfig(arrival_rate_per_min=0.0, sd_file=str(workdir / "gpu-nodes.json"))
    with FleetSim(config) as fleet:
        prom_config = "global:\n  scrape_interval: 1s\n" + fleet.scrape_config("1s")
        with PrometheusServer(workdir / "prom", prom_config) as prom:
            yield prom.url


def test_the_two_dashboards_exist() -> None:
    assert {"gpu-fleet.json", "gpuops-engine.json"} <= DASHBOARDS.keys()
    uids = [d["uid"] for d in DASHBOARDS.values()]
    assert len(uids) == len(set(uids)), uids


def test_provisioning_names_the_datasources_and_the_dashboard_dir() -> None:
    assert provisioned_datasources() == {
        "prometheus": "prometheus",
        "elasticsearch-decisions": "elasticsearch",
    }
    providers = yaml.safe_load(
        (REPO / "grafana" / "provisioning" / "dashboards" / "dashboards.yaml").read_text()
    )["providers"]
    assert [p["options"]["path"] for p in providers] == ["/var/lib/grafana/dashboards"]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_structure(name: str) -> None:
    assert structure_problems(name, DASHBOARDS[name]) == []


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_datasource_is_provisioned(name: str, known: dict[str, str]) -> None:
    assert datasource_problems(name, DASHBOARDS[name], known) == []


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_decision_annotations_use_mapped_fields(name: str, known: dict[str, str]) -> None:
    dashboard = DASHBOARDS[name]
    assert any(
        known.get(a.get("datasource", {}).get("uid", "")) == "elasticsearch"
        for a in dashboard["annotations"]["list"]
    ), "no annotations from Elasticsearch"
    assert annotation_problems(name, dashboard, known) == []


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_query_runs_on_a_real_prometheus(
    name: str, prom_url: str, known: dict[str, str]
) -> None:
    dashboard = DASHBOARDS[name]
    assert len(prometheus_queries(name, dashboard, known)) >= 10
    need_data = name == FLEET_DASHBOARD
    assert query_problems(prom_url, name, dashboard, known, need_data) == []


# ── self-checks: a broken dashboard must fail the same checks ─────────────────────────────────


def broken(kind: str) -> dict[str, Any]:
    dashboard = copy.deepcopy(DASHBOARDS[FLEET_DASHBOARD])
    panel = next(p for p in walk_panels(dashboard["panels"]) if p.get("targets"))
    target = panel["targets"][0]
    if kind == "syntax":
        target["expr"] = "sum(rate(nvml_gpu_utilization_ratio[$__rate_interval])"
    elif kind == "no-data":
        target["expr"] = 'nvml_gpu_utilisation_ratio{node=~"$node"}'
    elif kind == "undefined-variable":
        target["expr"] = 'nvml_gpu_utilization_ratio{node=~"$nodes"}'
    elif kind == "datasource":
        target["datasource"] = {"type": "prometheus", "uid": "prometheus-typo"}
    elif kind == "annotation-field":
        annotation = dashboard["annotations"]["list"][-1]
        annotation["target"]["query"] = "event.knd:event"
    return dashboard


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("syntax", "Prometheus refuses"),
        ("no-data", "no data from 'nvml_gpu_utilisation_ratio"),
        ("undefined-variable", "$nodes is not a variable"),
        ("datasource", "uid 'prometheus-typo' is not provisioned"),
        ("annotation-field", "field 'event.knd' is not mapped"),
    ],
)
def test_a_broken_dashboard_fails(
    kind: str, expected: str, prom_url: str, known: dict[str, str]
) -> None:
    dashboard = broken(kind)
    problems = (
        datasource_problems("broken.json", dashboard, known)
        + annotation_problems("broken.json", dashboard, known)
        + query_problems(
            prom_url, "broken.json", dashboard, known, need_data=kind == "no-data", data_timeout=10
        )
    )
    assert problems, f"a {kind} mistake went unnoticed"
    assert any(expected in p for p in problems), problems
