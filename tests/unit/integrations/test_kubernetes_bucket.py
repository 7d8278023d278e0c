"""The client-side rate limit of the Kubernetes client (gpuops.integrations.kubernetes.client)."""

from __future__ import annotations

from gpuops.integrations.kubernetes.client import KubeRejected, TokenBucket, check_name


def test_the_bucket_lets_a_burst_through_then_paces_at_qps() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    bucket = TokenBucket(qps=5, burst=3, clock=lambda: now[0], sleep=sleep)
    waits = [bucket.take() for _ in range(6)]
    assert waits[:3] == [0.0, 0.0, 0.0]
    assert [round(w, 3) for w in waits[3:]] == [0.2, 0.2, 0.2]
    now[0] += 10  # idle: the bucket fills up to its burst, no more
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert round(bucket.take(), 3) == 0.2


def test_only_kubernetes_names_reach_a_path() -> None:
    assert check_name("node", "gpu-1.example.com") == "gpu-1.example.com"
    for bad in ("..", ".", "a/b", "?x=", "%2F", "A", "-a", "a_b", ""):
        try:
            check_name("pod", bad)
        except KubeRejected as exc:
            assert repr(bad) in str(exc)
        else:
            raise AssertionError(f"{bad!r} accepted")
    try:
        check_name("namespace", "a.b")
    except KubeRejected:
        pass
    else:
        raise AssertionError("a namespace with a dot accepted")
