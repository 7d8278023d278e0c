"""The console's parts without a server: sessions (expiry, removed and replaced users, a bounded
number per user), the sign-in limiter's memory, link encoding and the CSV export's formula
guard. Through the running API: tests/integration/api/test_console.py; the pages in a browser:
tests/browser."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from urllib.parse import unquote

import pytest
from jinja2 import UndefinedError

from gpuops.api.console.pages import _csv
from gpuops.api.console.sessions import SessionStore, SignInLimiter
from gpuops.api.console.web import environment, grafana_link, kibana_link
from gpuops.api.tokens import TokenStore
from gpuops.model.telling import plural
from gpuops.settings import ConsoleSettings
from tests.builders import write_tokens


def test_sessions_expire_and_end_with_their_user(tmp_path: Path) -> None:
    tokens = {"admin": "admin-token-0123456789", "developer": "dev-token-0123456789"}
    write_tokens(tmp_path / "tokens.yaml", tokens)
    store = TokenStore(tmp_path / "tokens.yaml", environ={})
    store.reload()
    now = [1000.0]
    sessions = SessionStore(store, ttl=60, clock=lambda: now[0])
    assert sessions.sign_in("wrong") is None
    admin = sessions.sign_in(tokens["admin"])
    dev = sessions.sign_in(tokens["developer"])
    assert admin and dev
    found = sessions.find(admin[0])
    assert found and found[1].name == "alice" and found[1].roles == ("admin",)
    assert admin[1].csrf != dev[1].csrf and admin[0] != dev[0]
    write_tokens(tmp_path / "tokens.yaml", tokens, roles=["admin"])
    store.reload()
    assert sessions.find(dev[0]) is None  # the user was removed: their session ends at once
    now[0] += 60
    assert sessions.find(admin[0]) is None
    assert sessions.find("") is None and sessions.find(None) is None


def test_links_encode_the_labels() -> None:
    settings = ConsoleSettings(grafana_url="http://g:3000/", kibana_url="http://k:5601")
    link = grafana_link(settings, {"node": "a&b=c", "uuid": "GPU 1"})
    assert link == "http://g:3000/d/gpuops-gpu-fleet?var-node=a%26b%3Dc&var-uuid=GPU+1"
    kibana = kibana_link(settings, "node=x' OR '1\"")
    assert kibana is not None and kibana.startswith("http://k:5601/app/discover#/?_a=")
    state = unquote(kibana.split("_a=", 1)[1])
    assert state == "(query:(language:kuery,query:'gpuops.target.key : \"node=x!' OR !'1\\\"\"'))"
    assert grafana_link(ConsoleSettings(), {"node": "n"}) is None


def test_the_csv_export_quotes_what_a_spreadsheet_would_run() -> None:
    row = {k: "" for k in ("@timestamp", "dataset", "action", "outcome", "user", "roles")}
    row |= {"source_ip": "", "policy": "", "message": "=HYPERLINK(1)", "error": "-2+3"}
    text = _csv([row])
    assert "'=HYPERLINK(1)" in text and "'-2+3" in text


def test_the_csv_export_quotes_a_formula_behind_a_tab_or_line_break() -> None:
    # OWASP's list: = + - @, and tab and carriage return, which spreadsheets skip before one;
    # a bare carriage return must stay inside its quoted cell (else it ends the row there)
    row = {k: "" for k in ("@timestamp", "dataset", "action", "outcome", "user", "roles")}
    row |= {"source_ip": "\t=1+2", "policy": "\r=cmd|' /C calc'!A0", "message": "\n@SUM(1)"}
    row |= {"error": "plain"}
    rows = list(csv.reader(io.StringIO(_csv([row]), newline="")))
    assert len(rows) == 2, rows
    cells = rows[1]
    assert cells[6:] == ["'\t=1+2", "'\r=cmd|' /C calc'!A0", "'\n@SUM(1)", "plain"]


def test_a_session_ends_when_its_token_is_replaced(tmp_path: Path) -> None:
    # the user stays, with a new token (the old one leaked): sessions made with the old one end
    tokens = {"admin": "admin-token-0123456789"}
    write_tokens(tmp_path / "tokens.yaml", tokens)
    store = TokenStore(tmp_path / "tokens.yaml", environ={})
    store.reload()
    sessions = SessionStore(store, ttl=3600)
    old = sessions.sign_in(tokens["admin"])
    assert old and sessions.find(old[0])
    write_tokens(tmp_path / "tokens.yaml", {"admin": "rotated-token-9876543210"})
    store.reload()
    assert sessions.find(old[0]) is None
    new = sessions.sign_in("rotated-token-9876543210")
    assert new and sessions.find(new[0]) and new[2].name == "alice"


def test_one_user_signing_in_again_and_again_keeps_a_bounded_number_of_sessions(
    tmp_path: Path,
) -> None:
    tokens = {"admin": "admin-token-0123456789", "auditor": "auditor-token-0123456789"}
    write_tokens(tmp_path / "tokens.yaml", tokens)
    store = TokenStore(tmp_path / "tokens.yaml", environ={})
    store.reload()
    sessions = SessionStore(store, ttl=3600, max_per_user=5)
    auditor = sessions.sign_in(tokens["auditor"])
    made = [sessions.sign_in(tokens["admin"]) for _ in range(1000)]
    assert len(sessions) == 6
    assert all(m and sessions.find(m[0]) for m in made[-5:])  # the newest five live
    assert not any(m and sessions.find(m[0]) for m in made[:-5])
    assert auditor and sessions.find(auditor[0])  # another user's session is not pushed out


def test_the_sign_in_limiter_forgets_old_addresses() -> None:
    now = [0.0]
    limiter = SignInLimiter(2, 60, clock=lambda: now[0], max_addresses=100)
    for i in range(1000):
        limiter.failed(f"10.0.{i // 256}.{i % 256}")
        now[0] += 1
    assert len(limiter) <= 100
    limiter.failed("192.0.2.1")
    assert limiter.retry_after("192.0.2.1") is None
    limiter.failed("192.0.2.1")
    assert limiter.retry_after("192.0.2.1") == 60


PAGE = {"viewer": None, "standby": None, "nav": [], "csrf": "c", "when": str, "path": "/"}
"""What ``gpuops.api.console.web.render`` gives every page."""


def test_a_name_the_route_does_not_give_is_an_error_not_an_empty_cell() -> None:
    env = environment()
    with pytest.raises(UndefinedError, match="'filename' is undefined"):
        env.get_template("validated.html").render(
            **PAGE, result={"ok": True, "policies": 1, "note": None}, text=""
        )
    # a template may still ask whether it was given one
    assert (
        env.from_string("{{ x | default('-') }}{% if y is defined %}y{% endif %}").render() == "-"
    )


def test_the_pages_say_one_policy_one_error_and_one_gpu() -> None:
    env = environment()
    validated = env.get_template("validated.html")
    page = {**PAGE, "filename": "a.yaml", "text": ""}
    valid = validated.render(**page, result={"ok": True, "policies": 1, "note": None})
    assert "Valid: 1 policy." in valid
    invalid = validated.render(
        **page,
        result={
            "ok": False,
            "errors": [{"file": "a.yaml", "line": 3, "message": "bad"}],
            "note": None,
        },
    )
    assert "1 error:" in invalid and "errors" not in invalid.split("1 error:")[0][-20:]
    quota = env.get_template("quota.html").render(
        **PAGE,
        settings={"max_gpus": 8},
        requests=[],
        active=[{"project": "p", "gpus": 1, "nodes": 1, "pool": "a", "ends_at": 0}],
        projects=[{"name": "p", "base": 1, "granted": 1, "quota": 2, "usage": 1.0, "pending": 0}],
        usage_asked=True,
        usage_error=None,
        can_request=False,
        can_decide=False,
        duration=str,
    )
    assert "p: 1 GPU (1 node in pool a)" in quota
    assert "1 GPUs" not in quota and "2 GPUs" in quota


def test_the_decisions_table_tells_each_verdict_in_words_and_keeps_the_token() -> None:
    row = {
        "id": "d1",
        "at": 0,
        "policy": "reclaim-idle",
        "target": {"key": "node=n1"},
        "action": {"type": "reclaim"},
        "transition": "fire",
        "undoes": None,
        "undo": None,
        "state": "held",
        "effect": None,
    }
    page = (
        environment()
        .get_template("decisions.html")
        .render(
            **PAGE,
            decisions=[
                {**row, "verdict": "suppressed:cooldown"},
                {**row, "id": "d2", "verdict": "awaiting_approval"},
                {**row, "id": "d3", "verdict": "some_future_verdict"},
            ],
            caption="3 decisions",
            policies=[],
            verdicts=[],
            filters=dict.fromkeys(
                ("policy", "target", "verdict", "transition", "since", "until"), ""
            ),
        )
    )
    assert '<td class="verdict" title="suppressed:cooldown">held by the cooldown</td>' in page
    assert ">waits for an admin&#39;s approval</td>" in page
    assert '<td class="verdict" title="some_future_verdict">some_future_verdict</td>' in page


@pytest.mark.parametrize(
    ("n", "noun", "nouns", "told"),
    [(1, "policy", "policies", "1 policy"), (2, "policy", "policies", "2 policies")]
    + [(1.0, "GPU", None, "1 GPU"), (0.5, "GPU", None, "0.5 GPUs"), (3.0, "GPU", None, "3 GPUs")],
)
def test_plural_counts_whole_floats_as_integers(
    n: float, noun: str, nouns: str | None, told: str
) -> None:
    assert plural(n, noun, nouns) == told
