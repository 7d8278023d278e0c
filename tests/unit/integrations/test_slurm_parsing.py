"""What the Slurm exporter and executor read from Slurm's answers, without a Slurm: GRES
strings, node states, gres.conf minor numbers, and label values kept as data in the PromQL the
executor sends (the real-Slurm tests are in tests/integration/slurm)."""

from __future__ import annotations

from pathlib import Path

import pytest
import responses

from gpuops.actions.base import PermanentError, TemporaryError
from gpuops.actions.slurm import SlurmExecutor
from gpuops.integrations.slurm.client import (
    SlurmClient,
    SlurmRejected,
    check_name,
    expand_gres_index,
    gres_gpus,
    job_gpus_requested,
)
from gpuops.integrations.slurm.gres import GresConfError, minor_numbers
from gpuops.integrations.slurm.nodes import node_state
from gpuops.model.decisions import ActionSpec, Decision, Evidence, Target, Transition


@pytest.mark.parametrize(
    ("detail", "indexes"),
    [
        ("gpu:1(IDX:0)", [0]),
        ("gpu:2(IDX:0-1)", [0, 1]),
        ("gpu:a100:3(IDX:0,2-3)", [0, 2, 3]),
        ("gpu:h100:1(IDX:5),shard:0(IDX:N/A)", [5]),
        ("N/A", []),
    ],
)
def test_gres_detail_gives_the_gpu_indexes(detail: str, indexes: list[int]) -> None:
    assert expand_gres_index(detail) == indexes


def test_gpu_counts_of_gres_and_tres_strings() -> None:
    assert gres_gpus("gpu:2") == 2
    assert gres_gpus("gres:gpu:a100:4") == 4
    assert gres_gpus("gres/gpu=3,gres/shard=8") == 3
    assert gres_gpus("gpu:0(IDX:N/A)") == 0
    assert gres_gpus("") == 0
    assert job_gpus_requested({"tres_per_node": "gres:gpu:2", "node_count": 3}) == 6
    assert job_gpus_requested({"tres_per_job": "gres:gpu:5", "tres_per_node": "gres:gpu:1"}) == 5


@pytest.mark.parametrize(
    ("state", "flags", "word"),
    [
        ("idle", [], "idle"),
        ("mixed", ["DRAIN"], "draining"),
        ("idle", ["DRAIN"], "drained"),
        ("down", ["DRAIN", "NOT_RESPONDING"], "down"),
        ("idle", ["CLOUD", "DRAIN", "POWERED_DOWN"], "powered_down"),
        ("idle", ["CLOUD", "POWERING_UP"], "powering_up"),
        ("allocated", [], "allocated"),
    ],
)
def test_node_state_words(state: str, flags: list[str], word: str) -> None:
    assert node_state({"state": state, "state_flags": flags}) == word


class Hostlists(SlurmClient):
    def hostnames(self, expression: str) -> list[str]:
        return {"gpu-[1-2]": ["gpu-1", "gpu-2"]}.get(expression, [expression])


def test_gres_conf_maps_indexes_to_minor_numbers(tmp_path: Path) -> None:
    conf = tmp_path / "gres.conf"
    conf.write_text(
        "AutoDetect=off\n"
        "NodeName=gpu-[1-2] Name=gpu Type=a100 File=/dev/nvidia[1,3]  # two of four\n"
        "NodeName=gpu-9 Name=gpu File=/dev/nvidia0\n"
        "NodeName=gpu-9 Name=gpu File=/dev/nvidia2\n"
        "NodeName=gpu-9 Name=shard Count=8\n"
    )
    assert minor_numbers(conf, Hostlists()) == {"gpu-1": [1, 3], "gpu-2": [1, 3], "gpu-9": [0, 2]}
    conf.write_text("Name=gpu File=/dev/gpus/all\n")
    with pytest.raises(GresConfError) as raised:
        minor_numbers(conf, Hostlists())
    assert str(raised.value) == (
        f"{conf}:1: File=/dev/gpus/all: '/dev/gpus/all' does not end in a device number "
        "(expected /dev/nvidiaN)"
    )


@pytest.mark.parametrize("name", ["gpu-[1-3]", "a,b", "-N", "a b", "x;rm", ""])
def test_odd_names_are_refused(name: str) -> None:
    with pytest.raises(SlurmRejected):
        check_name("node", name)


def _reclaim(**labels: str) -> Decision:
    return Decision(
        id="d1",
        policy="reclaim-idle-gpus",
        group="g",
        target=Target.from_labels(labels, None),
        transition=Transition.FIRE,
        action=ActionSpec("reclaim", "slurm", {}),
        evidence=Evidence("x", 0.0, 0.0, 0.0),
        at=0.0,
        episode_start=0.0,
    )


@responses.activate
def test_the_gpu_is_mapped_to_its_job_with_label_values_as_data() -> None:
    responses.get(
        "http://prom:9090/api/v1/query",
        json={"status": "success", "data": {"resultType": "vector", "result": []}},
    )
    executor = SlurmExecutor({"prometheus_url": "http://prom:9090", "bin_dir": "/nonexistent"})
    with pytest.raises(PermanentError) as raised:
        executor.run(_reclaim(node="gpu-1", uuid='GPU-1"} or vector(1) or {x="'))
    sent = responses.calls[0].request.params["query"]
    selector = 'gpuops_gpu_allocated{node="gpu-1",uuid="GPU-1\\"} or vector(1) or {x=\\""}'
    assert sent == f"timestamp({selector}) and {selector} == 1"
    assert "no job holds it now" in str(raised.value)


def _allocated(*series: tuple[str, float]) -> None:
    """Prometheus answers ``timestamp(...)`` of ``gpuops_gpu_allocated`` at 1000 s: each series
    (its job, the age of its newest sample)."""
    result = [
        {"metric": {"node": "gpu-1", "uuid": "GPU-1", "job": job}, "value": [1000, str(1000 - age)]}
        for job, age in series
    ]
    responses.get(
        "http://prom:9090/api/v1/query",
        json={"status": "success", "data": {"resultType": "vector", "result": result}},
    )


@responses.activate
def test_a_stale_allocation_series_names_no_job() -> None:
    """A job's allocation series older than the engine's bound (the job ended, its exporter
    went on without a staleness marker) names no job: the action waits; with a fresh series
    beside it, the fresh one's job is the GPU's."""
    executor = SlurmExecutor(
        {"prometheus_url": "http://prom:9090", "bin_dir": "/nonexistent", "max_sample_age_s": 30}
    )
    _allocated(("17", 120.0))
    with pytest.raises(TemporaryError) as raised:
        executor.run(_reclaim(node="gpu-1", uuid="GPU-1"))
    assert (
        "Prometheus names the job of GPU GPU-1 on gpu-1 only in series older than "
        "executors.slurm.max_sample_age_s (30 s): job 17 last seen 120 s ago"
    ) in str(raised.value)
    responses.reset()
    _allocated(("17", 120.0), ("18", 3.0))
    assert executor._job_holding("gpu-1", "GPU-1") == "18"


def test_without_prometheus_a_gpu_cannot_be_mapped_to_a_job() -> None:
    with pytest.raises(PermanentError) as raised:
        SlurmExecutor({}).run(_reclaim(node="gpu-1", uuid="GPU-1"))
    assert "executors.slurm.prometheus_url is not set" in str(raised.value)


def test_bad_settings_name_the_key() -> None:
    with pytest.raises(ValueError) as raised:
        SlurmExecutor({"reclaim": {"how": "kill"}})
    assert str(raised.value).startswith("executors.slurm settings: reclaim.how: Input should be")
