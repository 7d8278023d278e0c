"""Job classes' utilization profiles from their GPUs' series: the nearest of the fleet file's
profiles, a class's mean weighted by GPU time, its swing taken per job and GPU."""

from __future__ import annotations

import pytest

from gpuops.sim.profiles import GIB as G
from gpuops.sim.profiles import classes_of, profile_of


@pytest.mark.parametrize(
    ("mean", "swing", "profile"),
    [
        (0.90, 0.02, "training"),
        (0.60, 0.05, "training"),
        (0.55, 0.05, "light"),
        (0.25, 0.03, "light"),
        (0.10, 0.01, "notebook"),
        (0.35, 0.27, "inference"),
        (0.80, 0.15, "inference"),
    ],
)
def test_the_nearest_profile(mean: float, swing: float, profile: str) -> None:
    assert profile_of(mean, swing) == profile


def test_a_class_is_its_project_and_pool_weighted_by_gpu_time() -> None:
    rows = [
        # one job on one GPU for 100 samples at a steady 0.9, one for 300 at 0.1
        ({"project": "a", "partition": "gpu", "job": "1", "uuid": "u0"}, 100.0, 90.0, 81.0, 8 * G),
        ({"project": "a", "partition": "gpu", "job": "2", "uuid": "u1"}, 300.0, 30.0, 3.0, 2 * G),
        ({"project": "a", "partition": "gpu", "job": "5", "uuid": "u4"}, 1.0, 0.0, 0.0, 3 * G),
        # half the samples at 0 and half at 1: swings by 0.5
        ({"project": "b", "partition": "gpu", "job": "3", "uuid": "u2"}, 10.0, 5.0, 5.0, 0.0),
        ({"project": "a", "partition": "cpu", "job": "4", "uuid": "u3"}, 10.0, 5.0, 5.0, 0.0),
    ]
    found = classes_of(rows, ["gpu", "a6000"], 60.0)
    assert set(found) == {("a", "gpu"), ("b", "gpu")}  # no pool "cpu": left out
    a = found[("a", "gpu")]
    assert a.mean == pytest.approx(120 / 401) and a.swing == pytest.approx(0.0, abs=1e-6)
    assert a.gpu_hours == pytest.approx(401 * 60 / 3600) and a.profile == "light"
    assert a.memory_gib == 3.0  # the median of its jobs' peaks: 8, 2 and 3 GiB
    b = found[("b", "gpu")]
    assert b.swing == pytest.approx(0.5) and b.profile == "inference"
    assert b.memory_gib is None  # no memory reported
    one_pool = classes_of(rows, ["default"], 60.0)  # one pool: every series is its own
    assert set(one_pool) == {("a", "default"), ("b", "default")}
    assert one_pool[("a", "default")].gpu_hours == pytest.approx(411 * 60 / 3600)
