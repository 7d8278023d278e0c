"""``gpuops.runtime.leadership`` with a scripted lease and an injected monotonic clock: a leader
stops leading at three quarters of its lease after the last renewal was sent, even while the
renewal hangs; a lost lease demotes it once; a standby names the leader in its refusal."""

from __future__ import annotations

from typing import Any

import pytest

from gpuops.runtime.leadership import SAFETY, Change, Leadership, NotLeaderError
from gpuops.store.errors import StateError
from gpuops.store.lease import LeaderInfo

LEASE_S = 10.0


class ScriptedLease:
    """A lease whose answers the test sets."""

    def __init__(self) -> None:
        self.free = True
        self.renews = True
        self.fail: StateError | None = None
        self.epoch = 0
        self.holder: str | None = None
        self.released: list[int] = []

    def acquire(self, ttl_s: float) -> int | None:
        if self.fail:
            raise self.fail
        if not self.free:
            return None
        self.free = False
        self.epoch += 1
        self.holder = "a"
        return self.epoch

    def renew(self, epoch: int, ttl_s: float) -> bool:
        if self.fail:
            raise self.fail
        return self.renews and epoch == self.epoch

    def release(self, epoch: int) -> None:
        self.released.append(epoch)

    def current(self) -> LeaderInfo:
        if self.fail:
            raise self.fail
        return LeaderInfo(self.holder, "http://other:9843", self.epoch, 5.0)

    def close(self) -> None:
        pass


def leadership(lease: Any, now: list[float], changes: list[Change]) -> Leadership:
    return Leadership(
        lease,
        replica="a",
        lease_s=LEASE_S,
        renew_s=2.0,
        monotonic=lambda: now[0],
        on_change=changes.append,
    )


def test_a_sqlite_engine_always_leads() -> None:
    solo = leadership(None, [0.0], [])
    assert solo.solo and solo.leading() and solo.fence() is None
    solo.require()


def test_elected_then_stops_leading_when_renewals_fail_before_the_lease_can_expire() -> None:
    lease, now, changes = ScriptedLease(), [100.0], []
    lead = leadership(lease, now, changes)
    lead.step()
    assert lead.leading() and lead.fence() == ("a", 1)
    assert changes == [Change(True, "a", 1, "elected")]
    lease.fail = StateError("db: unreachable")
    now[0] += 2.0
    lead.step()  # the renewal fails, the lease is still counted on
    assert lead.leading()
    now[0] = 100.0 + SAFETY * LEASE_S  # no step ran: leading() needs none to say no
    assert not lead.leading() and lead.fence() is None
    lead.step()
    assert changes[1:] == [Change(False, "a", 1, "the lease ran out before it was renewed")]
    lead.step()
    assert len(changes) == 2, "demoted once"


def test_a_lease_taken_by_another_replica_demotes_and_the_refusal_names_the_leader() -> None:
    lease, now, changes = ScriptedLease(), [0.0], []
    lead = leadership(lease, now, changes)
    lead.step()
    lease.renews, lease.holder = False, "b"
    now[0] += 2.0
    lead.step()
    assert changes[-1] == Change(False, "a", 1, "another replica holds the lease now")
    with pytest.raises(NotLeaderError) as refused:
        lead.require()
    assert str(refused.value) == (
        "this engine replica (a) is a standby and takes no writes: the leader is b at"
        " http://other:9843 (epoch 1)"
    )


def test_a_clean_stop_releases_the_lease() -> None:
    lease, now, changes = ScriptedLease(), [0.0], []
    lead = leadership(lease, now, changes)
    lead.step()
    lead.stop()
    assert lease.released == [1]
    assert changes[-1] == Change(False, "a", 1, "stopped")
    assert not lead.leading()


@pytest.mark.parametrize(
    ("url", "link"),
    [
        ("http://b:9843", "http://b:9843"),
        ("https://b.example/gpuops", "https://b.example/gpuops"),
        ("http://b:9843\r\nSet-Cookie: x=1", None),  # a header must not be split
        ("http://bé:9843", None),  # not latin-1 safe in a header
        ("javascript:alert(1)", None),  # never a link in the console
        ("", None),
        (None, None),
    ],
)
def test_only_a_printable_http_url_of_the_lease_row_is_passed_on(
    url: str | None, link: str | None
) -> None:
    assert LeaderInfo("b", url, 1, 5.0).link == link
