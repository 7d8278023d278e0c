"""The Slurm veto feature read from a node as ``sinfo --json`` writes it: comma-separated text
(Slurm 22.05, what the integration tests run) or a list (later releases)."""

from __future__ import annotations

from gpuops.actions.slurm import _features


def test_features_from_text_and_from_lists() -> None:
    assert _features({"features": "fast,gpuops_do_not_touch", "active_features": "fast"}) == {
        "fast",
        "gpuops_do_not_touch",
    }
    assert _features({"features": ["a"], "active_features": ["b", ""]}) == {"a", "b"}
    assert _features({"features": "", "active_features": None}) == set()
