"""``TokenStore``: hashed tokens from a file and the environment, roles, reload semantics."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuops.api.tokens import (
    ROLE_PERMISSIONS,
    Permission,
    TokensError,
    TokenStore,
    add_user,
    hash_token,
)


def _entry(name: str, token: str, *roles: str) -> str:
    return f"  - {{name: {name}, roles: [{', '.join(roles)}], token_sha256: {hash_token(token)}}}\n"


def test_hash_is_sha256_hex_of_the_utf8_token() -> None:
    assert hash_token("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_file_and_environment_users(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text("users:\n" + _entry("alice", "t-a", "admin"))
    env = {"GPUOPS_API_TOKENS": "users:\n" + _entry("bob", "t-b", "developer", "auditor")}
    store = TokenStore(path, environ=env)
    assert store.reload() == 2
    alice = store.authenticate("t-a")
    assert alice is not None and alice.name == "alice" and alice.can(Permission.RULES_WRITE)
    bob = store.authenticate("t-b")
    assert bob is not None and bob.roles == ("developer", "auditor")
    assert not bob.can(Permission.APPROVALS_DECIDE)
    assert store.authenticate("t-c") is None
    assert store.authenticate_basic("alice", "t-a") == alice
    assert store.authenticate_basic("bob", "t-a") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("users: [", "not valid YAML"),
        (
            "users:\n" + _entry("eve", "x", "root"),
            "users.0.roles: Value error, unknown role 'root'",
        ),
        (
            "users:\n  - {name: eve, roles: [admin], token_sha256: hunter2}\n",
            "users.0.token_sha256: Value error, expected the 64 lowercase hex digits",
        ),
        (
            "users:\n" + _entry("a", "x", "admin") + _entry("a", "y", "admin"),
            "user 'a' is defined more",
        ),
        (
            "users:\n" + _entry("a", "x", "admin") + _entry("b", "x", "admin"),
            "users a, b share one",
        ),
        ("people: []\n", "people: Extra inputs are not permitted"),
    ],
)
def test_invalid_files_name_the_problem_and_keep_the_users(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text("users:\n" + _entry("alice", "t-a", "admin"))
    store = TokenStore(path, environ={})
    store.reload()
    path.write_text(text)
    with pytest.raises(TokensError, match=message) as caught:
        store.reload()
    assert str(path) in str(caught.value)
    assert "hunter2" not in str(caught.value)
    assert store.authenticate("t-a") is not None


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TokensError, match="cannot read: No such file"):
        TokenStore(tmp_path / "nope.yaml", environ={}).reload()


def test_role_table() -> None:
    assert ROLE_PERMISSIONS["admin"] == frozenset(Permission)
    assert all(p.value.endswith(":read") for p in ROLE_PERMISSIONS["auditor"])
    assert ROLE_PERMISSIONS["alertmanager"] == {Permission.ALERTS_RECEIVE}
    developer = ROLE_PERMISSIONS["developer"]
    assert Permission.QUOTA_REQUEST in developer and Permission.QUOTA_DECIDE not in developer
    assert Permission.RULES_WRITE not in developer and Permission.ENGINE_CONTROL not in developer


def test_the_file_is_watched_a_user_added_or_removed_counts_at_the_next_request(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text("users:\n" + _entry("alice", "t-a", "admin"))
    store = TokenStore(path, environ={})
    store.reload()
    assert store.authenticate("t-b") is None
    add_user(path, {"name": "bob", "roles": ["auditor"], "token_sha256": hash_token("t-b")})
    bob = store.authenticate("t-b")  # no reload, no SIGHUP
    assert bob is not None and bob.roles == ("auditor",)
    path.write_text("users:\n" + _entry("bob", "t-b", "auditor") + "# alice left\n")
    assert store.authenticate("t-a") is None
    assert store.holder(hash_token("t-a")) is None
    assert [u.name for u in store.users] == ["bob"]
    # a broken file keeps the users there were, said once
    path.write_text("users: [{name: carol}]\n")
    assert store.authenticate("t-b") is not None and store.authenticate("t-b") is not None
    refused = [r for r in caplog.records if "API users not reloaded" in r.getMessage()]
    assert len(refused) == 1 and refused[0].levelname == "ERROR"
    assert (
        f"the current ones stay: {path}: users.0.roles: Field required" in refused[0].getMessage()
    )


def test_a_store_never_loaded_reads_nothing_by_itself(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text("users:\n" + _entry("alice", "t-a", "admin"))
    assert TokenStore(path, environ={}).authenticate("t-a") is None
