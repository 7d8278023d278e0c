"""`gpuops backtest`: what policies would have decided over Prometheus history.

``run`` queries a Prometheus (``--prometheus URL``) or serves a TSDB directory with a temporary
one (``--tsdb DIR``); ``load-helios`` turns the Helios cluster data into such a directory.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import click

from gpuops.model.evaluation.step import Freshness
from gpuops.model.rules.durations import DurationError, parse_duration
from gpuops.model.rules.loader import load_rules
from gpuops.model.rules.model import Policy, RulesError, RuleSet
from gpuops.offline.backtest import Backtest, run_backtest
from gpuops.settings import PrometheusSettings
from gpuops.sim import helios
from gpuops.sources import QueryError
from gpuops.sources.prometheus import PrometheusClient
from gpuops.sources.promproc import PrometheusServer, find_binary


@click.group(name="backtest")
def backtest() -> None:
    """Run policies over history (nothing is executed)."""


def _time(value: str) -> float:
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not an ISO time such as 2020-05-01T00:00:00Z"
        ) from None
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


@backtest.command(name="run")
@click.argument(
    "rules_paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path)
)
@click.option("--prometheus", "url", help="URL of a Prometheus that holds the history.")
@click.option(
    "--tsdb",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Prometheus data directory, served by a temporary Prometheus (instead of --prometheus).",
)
@click.option("--start", required=True, help="Start, ISO time (UTC when no offset is given).")
@click.option("--end", required=True, help="End, ISO time.")
@click.option(
    "--step", default="1m", show_default=True, help="Evaluation step (Prometheus duration)."
)
@click.option("--policy", "only", multiple=True, help="Only this policy (repeatable).")
@click.option(
    "--keep-mode", is_flag=True, help="Judge dry-run policies as dry-run (default: as enforced)."
)
@click.option(
    "--show", default=20, show_default=True, help="Decisions listed per policy (0: none)."
)
@click.option(
    "--json", "as_json", is_flag=True, help="One JSON object per policy instead of a table."
)
@click.option(
    "--scrape-interval",
    default="1m",
    show_default=True,
    help="How often the history was scraped (Prometheus duration): as in the engine, a sample"
    " older than 2 x this (or the group's max_sample_age) is stale and holds its targets.",
)
def run(
    rules_paths: tuple[Path, ...],
    url: str | None,
    tsdb: Path | None,
    start: str,
    end: str,
    step: str,
    only: tuple[str, ...],
    keep_mode: bool,
    show: int,
    as_json: bool,
    scrape_interval: str,
) -> None:
    """Evaluate RULES_PATHS over [--start, --end] and summarise the decisions."""
    if (url is None) == (tsdb is None):
        raise click.UsageError("give exactly one of --prometheus URL or --tsdb DIR")
    try:
        scraped = PrometheusSettings(scrape_interval=parse_duration(scrape_interval))
    except DurationError as exc:
        raise click.BadParameter(str(exc), param_hint="--scrape-interval") from None
    try:
        step_s = parse_duration(step)
        rules = load_rules(list(rules_paths))
    except DurationError as exc:
        raise click.BadParameter(str(exc), param_hint="--step") from None
    except RulesError as exc:
        raise click.ClickException(f"invalid rules:\n{exc}") from None
    policies = [p for p in rules.policies() if not only or p.name in only]
    unknown = set(only) - {p.name for p in policies}
    if unknown:
        raise click.BadParameter(
            f"no policy named {', '.join(sorted(unknown))}", param_hint="--policy"
        )
    begin, finish = _time(start), _time(end)
    if finish <= begin:
        raise click.BadParameter("must be after --start", param_hint="--end")
    with tempfile.TemporaryDirectory(prefix="gpuops-backtest-") as tmp:
        server = None
        if tsdb is not None:
            server = PrometheusServer(
                Path(tmp),
                "global: {scrape_interval: 1m}\n",
                extra_args=["--storage.tsdb.retention.time=100y"],
                data_dir=tsdb,
            )
            server.start()
            url = server.url
        assert url is not None
        try:
            result = run_backtest(
                policies,
                PrometheusClient(url, timeout_s=120),
                begin,
                finish,
                step_s,
                keep_mode,
                freshness=lambda p: _bounds(rules, p, scraped),
            )
        except QueryError as exc:
            raise click.ClickException(str(exc)) from None
        finally:
            if server is not None:
                server.stop()
    _print(result, show, as_json)


def _bounds(rules: RuleSet, policy: Policy, scraped: PrometheusSettings) -> Freshness:
    """``policy``'s freshness bounds, as the engine derives them from its group."""
    group = next(g for g in rules.groups if g.name == policy.group)
    return scraped.freshness(group.interval_s, group.max_sample_age_s)


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _print(result: Backtest, show: int, as_json: bool) -> None:
    for pb in result.results:
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "policy": pb.policy,
                        "steps": pb.steps,
                        "firing_steps": pb.firing_steps,
                        "summary": dict(pb.summary()),
                        "decisions": [
                            {
                                "at": _iso(d.at),
                                "transition": d.transition.value,
                                "repeat": d.repeat,
                                "target": d.target.key,
                                "verdict": d.verdict,
                                "reason": d.reason,
                                "value": d.evidence.value,
                            }
                            for d in pb.decisions
                        ],
                    }
                )
            )
            continue
        click.echo(
            f"== {pb.policy}: {pb.steps} steps of {result.step_s:g}s, "
            f"firing in {pb.firing_steps} =="
        )
        for key, n in sorted(pb.summary().items()):
            click.echo(f"  {key:<40} {n}")
        if not pb.decisions:
            click.echo("  (no decisions)")
        for d in pb.decisions[:show]:
            click.echo(f"  {_iso(d.at)}  {d.transition.value:<5} {d.target.key:<30} {d.verdict}")
        if len(pb.decisions) > show > 0:
            click.echo(f"  ... {len(pb.decisions) - show} more (--show N, or --json)")


@backtest.command(name="load-helios")
@click.option(
    "--data-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=Path("examples/helios-earth"),
    show_default=True,
    help="Folder of Helios Earth vc*.csv or vc*.csv.gz files (the repository ships vchbv).",
)
@click.option(
    "--vc", "vcs", multiple=True, help="Virtual cluster to load (repeatable; default all)."
)
@click.option(
    "--tsdb",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Prometheus data directory to create blocks in (for `backtest run --tsdb`).",
)
@click.option("--start", default=None, help="Only from this ISO time on (default: all).")
@click.option("--end", default=None, help="Only up to this ISO time (default: all).")
def load_helios(
    data_dir: Path, vcs: tuple[str, ...], tsdb: Path, start: str | None, end: str | None
) -> None:
    """Turn Helios per-minute VC sequences into Prometheus blocks (one pool per VC)."""
    names = list(vcs) or helios.available(data_dir)
    files = {n: helios.vc_file(data_dir, n) for n in names}
    missing = [n for n, path in files.items() if path is None]
    if missing or not names:
        known = ", ".join(helios.available(data_dir)) or "none"
        raise click.BadParameter(
            f"no data for {', '.join(missing) or 'any VC'} (known: {known})", param_hint="--vc"
        )
    try:
        sequences = [helios.read_vc(path) for path in files.values() if path is not None]
    except helios.HeliosError as exc:
        raise click.ClickException(str(exc)) from None
    begin = _time(start) if start else None
    finish = _time(end) if end else None
    sequences = [helios.window(s, begin, finish) for s in sequences]
    if not any(s.times for s in sequences):
        raise click.BadParameter("no data between --start and --end", param_hint="--start")
    tsdb.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpuops-helios-") as tmp:
        om = Path(tmp) / "helios.om"
        samples = helios.write_openmetrics(sequences, om)
        proc = subprocess.run(
            [
                find_binary("promtool"),
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                str(om),
                str(tsdb),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
    if proc.returncode != 0:
        raise click.ClickException(f"promtool failed: {proc.stderr.strip()[-500:]}")
    first = min(s.times[0] for s in sequences if s.times)
    last = max(s.times[-1] for s in sequences if s.times)
    click.echo(f"{samples} samples of {len(sequences)} VCs ({', '.join(names)}) in {tsdb}")
    click.echo(f"time range: {_iso(first)} .. {_iso(last)}")
