"""The ``webhook`` executor before anything is sent: settings and params are validated, a
missing or bad URL is a permanent error, the lane is the receiver's origin, ``Retry-After``
is read in seconds and HTTP dates. Against a real receiver:
tests/integration/actions/test_webhook.py."""

from __future__ import annotations

import time
from email.utils import formatdate
from typing import Any

import pytest

from gpuops.actions.base import PermanentError
from gpuops.actions.webhook import WebhookExecutor, retry_after
from tests.unit.actions.support import make_decision


def test_a_decision_without_a_usable_url_has_the_executors_own_lane() -> None:
    assert WebhookExecutor().lane(make_decision()) == ""
    bad: list[dict[str, Any]] = [
        {"url": "ftp://h/x"},
        {"url": "http://h:99999/"},
        {"timeout_s": -1},
    ]
    for params in bad:
        assert WebhookExecutor({"url": "http://h/"}).lane(make_decision(params=params)) == ""
    per_node = {"url": "http://{{ $labels.node }}/hook"}
    assert WebhookExecutor().lane(make_decision(params=per_node, node="not a host")) == ""


def test_bad_params_are_permanent() -> None:
    with pytest.raises(PermanentError) as exc:
        WebhookExecutor({"url": "http://x.invalid"}).run(make_decision(params={"timeout_s": -1}))
    assert str(exc.value) == "webhook params: timeout_s: Input should be greater than 0"


def test_missing_or_bad_urls_are_permanent() -> None:
    with pytest.raises(PermanentError, match="webhook has no url: set params.url"):
        WebhookExecutor().run(make_decision())
    with pytest.raises(PermanentError) as exc:
        WebhookExecutor({"url": "{{ $labels.node }}/x"}).run(make_decision(node="n1"))
    assert str(exc.value) == (
        "webhook url 'n1/x' (from '{{ $labels.node }}/x') is not an http(s) URL"
    )


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after(None) is None
    assert retry_after("") is None
    assert retry_after("120") == 120.0
    assert retry_after("-5") == 0.0
    assert retry_after("soon") is None
    assert retry_after("nan") is None
    assert retry_after(formatdate(0, usegmt=True)) == 0.0  # in the past: at once
    ahead = retry_after(formatdate(time.time() + 3600, usegmt=True))
    assert ahead is not None and 3590 < ahead <= 3600


def test_settings_are_validated() -> None:
    with pytest.raises(ValueError) as typo:
        WebhookExecutor({"url": "http://x", "hmac_secert": "k"})
    assert (
        str(typo.value) == "executors.webhook settings: hmac_secert: Extra inputs are not permitted"
    )
    with pytest.raises(ValueError) as both:
        WebhookExecutor({"token": "a", "token_file": "/run/secrets/token"})
    assert str(both.value) == (
        "executors.webhook settings: (top): Value error, set token or token_file, not both"
    )


def test_the_lane_is_the_receivers_origin() -> None:
    """The gate isolates receivers by origin: labels in the path or query, credentials and the
    scheme's own port do not make another lane; a host templated from labels does."""
    ex = WebhookExecutor(
        {"url": "https://Hooks.example.com/{{ $labels.node }}?gpu={{ $labels.uuid }}"}
    )
    assert ex.lane(make_decision(node="n1", uuid="GPU-1")) == "https://hooks.example.com:443"
    assert ex.lane(make_decision(node="n2", uuid="GPU-7")) == "https://hooks.example.com:443"
    per_node = {"url": "http://u:p@{{ $labels.node }}:8080/hook"}
    assert ex.lane(make_decision(params=per_node, node="n1")) == "http://n1:8080"
    assert ex.lane(make_decision(params=per_node, node="10.0.0.2")) == "http://10.0.0.2:8080"
    assert ex.lane(make_decision(params=per_node, node="fe80::1")) == "http://[fe80::1]:8080"
    assert ex.lane(make_decision(params={"url": "http://h/x"})) == "http://h:80"
