"""The engine's Prometheus client: results become Samples, every failure a QueryError with a
message a person can read (the HTTP API is answered by ``responses``, in the process). Over a
real connection: tests/integration/sources/test_prometheus_client.py; a real Prometheus is met
in the other integration and e2e tests."""

from __future__ import annotations

import json
import random
from typing import Any
from urllib.parse import parse_qs

import orjson
import pytest
import requests
import responses

from gpuops.model.decisions import Sample, Vector, freeze
from gpuops.sources import QueryError
from gpuops.sources.prometheus import Answers, PrometheusClient, answers, parse_vector, vectors
from gpuops.sources.prometheus.vectors import decode_answer

URL = "http://prom.test:9090"


def vector(*series: tuple[dict[str, str], str]) -> dict[str, object]:
    result = [{"metric": m, "value": [1700000000.0, v]} for m, v in series]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


@responses.activate
def test_vector_samples_and_nan_dropped() -> None:
    responses.get(
        f"{URL}/api/v1/query",
        json=vector(({"uuid": "a"}, "0.1"), ({"uuid": "b"}, "NaN")),
    )
    (sample,) = PrometheusClient(URL).query("up", at=1700000000)
    assert dict(sample.labels) == {"uuid": "a"} and sample.value == 0.1
    assert responses.calls[0].request.params == {"query": "up", "time": "1700000000.000"}


@responses.activate
def test_scalar_is_one_sample() -> None:
    body = {"status": "success", "data": {"resultType": "scalar", "result": [1.0, "3"]}}
    responses.get(f"{URL}/api/v1/query", json=body)
    (sample,) = PrometheusClient(URL).query("vector(3)")
    assert sample.value == 3.0 and dict(sample.labels) == {}


@responses.activate
def test_bad_promql_is_a_query_error_naming_the_query() -> None:
    error = {"status": "error", "errorType": "bad_data", "error": "parse error"}
    responses.get(f"{URL}/api/v1/query", json=error, status=400)
    with pytest.raises(QueryError) as caught:
        PrometheusClient(URL).query("sum(")
    assert str(caught.value) == "Prometheus rejected 'sum(': HTTP 400: parse error"


@responses.activate
def test_a_prometheus_error_is_named_whole_and_a_page_that_is_none_capped() -> None:
    """Prometheus' own parse errors quote the parameter (``\\"query\\"``): the message is read
    decoded, not out of the body's repr, where it would stop at that first escaped quote. A
    proxy's page that holds no error is shown as it came, capped."""
    error = 'invalid parameter "query": 1:5: parse error: unexpected end of input'
    responses.get(f"{URL}/api/v1/query", json={"status": "error", "error": error}, status=400)
    with pytest.raises(QueryError) as caught:
        PrometheusClient(URL).query("sum(")
    assert str(caught.value) == f"Prometheus rejected 'sum(': HTTP 400: {error}"
    responses.replace(responses.GET, f"{URL}/api/v1/query", body="<html>" + "x" * 400, status=502)
    with pytest.raises(QueryError) as caught:
        PrometheusClient(URL).query("up")
    assert str(caught.value).startswith("Prometheus rejected 'up': HTTP Status Code 502 (b'<html>x")
    assert str(caught.value).endswith("…")


@responses.activate
def test_timeout_and_unreadable_answers() -> None:
    responses.get(f"{URL}/api/v1/query", body=requests.Timeout())
    with pytest.raises(QueryError, match="timed out after 2s$"):
        PrometheusClient(URL, timeout_s=2).query("up")
    responses.replace(responses.GET, f"{URL}/api/v1/query", body="<html>proxy</html>")
    with pytest.raises(QueryError, match="unreadable answer"):
        PrometheusClient(URL).query("up")


@responses.activate
def test_query_range_is_split_and_grouped_by_step() -> None:
    def answer(request: requests.PreparedRequest) -> tuple[int, dict[str, str], str]:
        params = dict(request.params)  # type: ignore[attr-defined]
        start, end, step = int(params["start"]), int(params["end"]), float(params["step"])
        values = [[t, "1"] for t in range(start, end + 1, int(step))]
        body = {
            "status": "success",
            "data": {
                "resultType": "matrix",
                "result": [{"metric": {"pool": "p"}, "values": values}],
            },
        }
        return 200, {}, json.dumps(body)

    responses.add_callback(responses.GET, f"{URL}/api/v1/query_range", callback=answer)
    steps = PrometheusClient(URL).query_range("x", 0, 60 * 25_000, 60)
    assert len(steps) == 25_001 and len(responses.calls) == 3  # 10,000 points a request
    assert steps[60.0][0].labels == {"pool": "p"}


@responses.activate
def test_an_answer_the_fast_pass_cannot_read_is_read_carefully() -> None:
    """The decoder reads series without a check per field; what it cannot read is
    read again carefully: a series without ``metric`` has no labels, a label value that is not
    a string becomes one, a value that is not a number is an error naming it."""
    body = vector(({"uuid": "a"}, "0.5"))
    body["data"]["result"] += [  # type: ignore[index]
        {"value": [1700000000.0, "0.25"]},
        {"metric": {"uuid": 7}, "value": [1700000000.0, "1"]},
    ]
    responses.get(f"{URL}/api/v1/query", json=body)
    samples = PrometheusClient(URL).query("up")
    assert [(dict(s.labels), s.value) for s in samples] == [
        ({"uuid": "a"}, 0.5),
        ({}, 0.25),
        ({"uuid": "7"}, 1.0),
    ]
    responses.replace(responses.GET, f"{URL}/api/v1/query", json=vector(({"u": "a"}, "x")))
    with pytest.raises(QueryError, match="not a number: 'x'"):
        PrometheusClient(URL).query("up")
    bad = {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}}
    responses.replace(responses.GET, f"{URL}/api/v1/query", json=bad)
    with pytest.raises(QueryError, match="returned a malformed series"):
        PrometheusClient(URL).query("up")


@pytest.mark.parametrize(
    "value",
    [
        [1700000000, True],  # float(True) was 1.0
        {"1": "x", "2": "y"},  # unpacked as its keys: ts 1, value 2.0
        [1700000000, " 1_0 "],  # float() reads 10.0
        [1700000000, "nan"],
        [1700000000, "infinity"],
        [1700000000, "１"],  # a full-width digit: float() reads 1.0
        [1700000000, 1],  # a number where Prometheus writes a string
        [True, "1"],
        ["1700000000", "1"],
    ],
)
def test_a_value_prometheus_would_not_write_is_a_query_error(value: object) -> None:
    """Values Prometheus never writes (any of them, read as a number, could fire a ``> 0.5``
    policy): the careful pass refuses them, naming the series."""
    with pytest.raises(QueryError, match="malformed series|not a number"):
        parse_vector([{"metric": {"uuid": "a"}, "value": value}], "x")


def test_every_value_format_prometheus_writes_is_read() -> None:
    written = ["1", "-0.25", "1e+06", "1.5E-07", "+Inf", "-Inf", ".5", "3."]
    raw = [{"metric": {"i": str(i)}, "value": [1700000000, v]} for i, v in enumerate(written)]
    raw.append({"metric": {}, "value": [1700000000.5, "NaN"]})  # dropped
    assert [s.value for s in parse_vector(raw, "x")] == [float(v) for v in written]
    (scalar,) = parse_vector([1700000000.5, "2"], "scalar(x)")
    assert (scalar.timestamp, scalar.value) == (1700000000.5, 2.0)
    with pytest.raises(QueryError, match="not a number"):
        parse_vector([1700000000.5, "0x10"], "scalar(x)")


@responses.activate
def test_a_long_query_is_posted_as_a_form() -> None:
    """A narrowed clear_expr for 1,000 targets (~40 kB) sent as a GET would be answered 414 by a
    proxy (nginx: ~8 kB), and the policy skipped at every evaluation while many targets fire:
    past MAX_GET_QUERY_CHARS it is a POST form; short ones stay GETs."""
    seen: list[tuple[str, str]] = []

    def proxy(request: requests.PreparedRequest) -> tuple[int, dict[str, str], str]:
        seen.append((request.method or "", request.headers.get("Content-Type", "")))
        if len(request.url or "") > 8192:
            return 414, {}, "<html>414 Request-URI Too Large</html>"
        form = request.body if request.method == "POST" else (request.url or "").split("?")[1]
        assert isinstance(form, str)
        query = parse_qs(form)["query"][0]
        body = vector(({"uuid": "a"}, "1"), ({"q": str(len(query))}, "2"))
        return 200, {}, json.dumps(body)

    responses.add_callback(responses.GET, f"{URL}/api/v1/query", callback=proxy)
    responses.add_callback(responses.POST, f"{URL}/api/v1/query", callback=proxy)
    values = json.dumps("|".join(f"GPU-{i:036d}" for i in range(1000)))
    long = f"x{{uuid=~{values}}} > 0"
    client = PrometheusClient(URL)
    assert [s.value for s in client.query(long, at=1700000000)] == [1.0, 2.0]
    assert client.query("up", at=1700000000)[1].labels == {"q": "2"}
    assert seen == [("POST", "application/x-www-form-urlencoded"), ("GET", "")]


def compact(*series: tuple[dict[str, str], str], at: float = 1700000000.0) -> bytes:
    """An answer's bytes as Prometheus writes them (compact JSON)."""
    result = [{"metric": m, "value": [at, v]} for m, v in series]
    return orjson.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})


def crafted(inner: str, outer: str, last: str) -> bytes:
    """Two series: one with a label holding a sample, one whose value comes first."""
    one = f'{{"metric":{{"a":"b","value":[1,"{inner}"]}},"value":[1,"{outer}"]}}'
    two = f'{{"value":[1,"{last}"],"metric":{{"c":"d"}}}}'
    return (
        f'{{"status":"success","data":{{"resultType":"vector","result":[{one},{two}]}}}}'.encode()
    )


def answered(*bodies: bytes) -> list[Vector]:
    """Each body decoded, in turn, as the answer to one query of one client."""
    client = PrometheusClient(URL)
    return [client._decode("q", body) for body in bodies]


def test_an_answer_with_the_series_of_the_last_one_reads_only_its_values() -> None:
    """The same series as the query's last answer (every byte but the values the
    same) share its labels and target keys; only the values and times are read."""
    a, b = {"node": "n1", "uuid": "a"}, {"node": "n1", "uuid": "b"}
    first, second = answered(
        compact((a, "0.1"), (b, "2")), compact((a, "1e+06"), (b, "-Inf"), at=1700000030.5)
    )
    assert second.metrics is first.metrics  # not decoded again
    assert first.target_keys(("node", "uuid")) == ["node=n1,uuid=a", "node=n1,uuid=b"]
    assert second.target_keys(("node", "uuid")) is first.target_keys(("node", "uuid"))
    assert list(second) == [
        Sample(freeze(a), 1e6, 1700000030.5),
        Sample(freeze(b), float("-inf"), 1700000030.5),
    ]


@pytest.mark.parametrize(
    ("first", "then"),
    [
        # another label value: its series are new
        (compact(({"uuid": "a"}, "1")), compact(({"uuid": "b"}, "2"))),
        # a label that looks like a sample (its quotes escaped in JSON): decoded in full
        (
            compact(({"uuid": 'x,"value":[1,"9"]}'}, "1")),
            compact(({"uuid": 'y,"value":[1,"9"]}'}, "2")),
        ),
        # a label valued "value": never remembered
        (compact(({"job": "value"}, "1")), compact(({"job": "value"}, "2"))),
        # a "value" that is no sample's (in a label, or before "metric"): never remembered,
        # else the next answer's values would be read from the wrong places
        (crafted("1", "1", "1"), crafted("7", "8", "1")),
    ],
)
def test_an_answer_with_other_series_is_decoded_in_full(first: bytes, then: bytes) -> None:
    one, two = answered(first, then)
    assert two.metrics is not one.metrics
    assert list(two) == list(parse_vector(orjson.loads(then)["data"]["result"], "q"))


class Counted:
    """Calls to ``gpuops.sources.prometheus``' answer split and full decoding, counted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.splits = self.decodings = 0
        sample, decode = answers._SAMPLE, vectors.decode_vector

        class Split:
            def split(_, body: bytes) -> list[bytes]:
                self.splits += 1
                return sample.split(body)

        def decoding(raw: object, expr: str) -> Vector:
            self.decodings += 1
            return decode(raw, expr)

        monkeypatch.setattr(answers, "_SAMPLE", Split())
        monkeypatch.setattr(vectors, "decode_vector", decoding)

    def take(self) -> tuple[int, int]:
        """(splits, decodings) since the last take."""
        seen, self.splits, self.decodings = (self.splits, self.decodings), 0, 0
        return seen


def test_an_answer_with_other_series_is_split_once_and_decoded_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A changed answer costs one split and one full decoding (the split is reused to
    remember it, not made again), and a query whose series keep changing (too many each time
    to be mended: ``Answers.MEND_MIN``) is not split at all for ``Answers.PAUSE`` answers."""
    n = Answers.MEND_MIN + 1
    bodies = [
        compact(({"uuid": "a"}, "1"), *[({"uuid": f"b{i}-{j}"}, "2") for j in range(n)])
        for i in range(40)
    ]
    expected = [list(parse_vector(orjson.loads(b)["data"]["result"], "q")) for b in bodies]
    counted = Counted(monkeypatch)
    client = PrometheusClient(URL)
    client._decode("q", bodies[0])
    assert counted.take() == (1, 1)
    assert client._decode("q", bodies[0]).values == [1.0] + [2.0] * n
    assert counted.take() == (1, 0)  # same series: split, not decoded
    client._decode("q", bodies[1])
    assert counted.take() == (1, 1)  # other series: one split, one decoding
    client._decode("q", bodies[2])  # other series again: the query pauses
    assert counted.take() == (1, 1)
    for i in range(3, 3 + Answers.PAUSE):
        assert list(client._decode("q", bodies[i])) == expected[i]
    assert counted.take() == (0, Answers.PAUSE)  # decoded as without the cache
    client._decode("q", bodies[30])  # tried again: split and remembered
    client._decode("q", bodies[31])  # other series: paused again at once
    client._decode("q", bodies[32])
    assert counted.take() == (2, 3)
    for _ in range(Answers.PAUSE):
        client._decode("q", bodies[33])
    # the pause's last PAUSE - 1 answers unsplit, then one split and remembered
    assert counted.take() == (1, Answers.PAUSE)
    assert client._decode("q", bodies[33]).values == [1.0] + [2.0] * n
    assert counted.take() == (1, 0)  # recognised: the count of misses starts again


def test_an_answer_with_a_few_new_series_is_mended(monkeypatch: pytest.MonkeyPatch) -> None:
    """With 1 % of the GPUs changing state an evaluation, decoding the churning answers in
    full would be a fifth of an evaluation at 50,000 GPUs. An answer with a few new series
    keeps the labels of those it shares with the last answer (the same objects) and decodes
    only the new ones, with no full decoding; what it reads is what a full decoding reads."""
    series = [({"node": f"n{i // 4}", "uuid": f"u{i}"}, "0.1") for i in range(1000)]
    client = PrometheusClient(URL)
    counted = Counted(monkeypatch)
    one = client._decode("q", compact(*series))
    changed = [*series[:10], ({"node": "n9", "uuid": "new"}, "+Inf"), *series[11:500]]
    body = compact(*changed, *series[600:], at=1700000030.0)
    two = client._decode("q", body)
    assert counted.take() == (2, 1)  # the first answer decoded in full, the second not
    assert list(two) == list(parse_vector(orjson.loads(body)["data"]["result"], "q"))
    assert two.metrics[0] is one.metrics[0] and two.metrics[500] is one.metrics[600]
    assert (two.target_keys(("uuid",)) or [])[10] == "uuid=new"
    counted.take()  # parse_vector's decoding above
    three = client._decode("q", compact(*changed, *series[600:], at=1700000060.0))
    assert counted.take() == (1, 0)  # the mended answer is the one remembered
    assert three.metrics is two.metrics


@pytest.mark.parametrize(
    "then",
    [
        # a new series whose value is NaN: not split off (its "value" token counted)
        compact(({"uuid": "a"}, "1"), ({"uuid": "new"}, "NaN")),
        # a new series holding more than metric and value (Prometheus writes no such thing)
        compact(({"uuid": "a"}, "1")).replace(
            b"]}}", b',{"metric":{"u":"n"},"x":1,"value":[1700000000.0,"2"]}]}}'
        ),
        # warnings before the series or after them: the text around the series differs
        compact(({"uuid": "a"}, "1"), ({"uuid": "new"}, "2")).replace(
            b'"status":"success",', b'"status":"success","warnings":["w"],'
        ),
        compact(({"uuid": "a"}, "1"), ({"uuid": "new"}, "2"))[:-1] + b',"warnings":["w"]}',
    ],
)
def test_an_answer_that_cannot_be_mended_soundly_is_decoded_in_full(
    then: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = PrometheusClient(URL)
    counted = Counted(monkeypatch)
    client._decode("q", compact(({"uuid": "a"}, "1"), ({"uuid": "b"}, "2")))
    counted.take()
    two = client._decode("q", then)
    assert counted.take() == (1, 1)  # decoded in full
    assert list(two) == list(parse_vector(orjson.loads(then)["data"]["result"], "q"))


HEAD = b'{"status":"success","data":{"resultType":"vector","result":['


def series(labels: bytes, time: bytes = b"1") -> bytes:
    return b'{"metric":' + labels + b',"value":[' + time + b',"1"]}'


A, B, C = b'{"u":"a"}', b'{"u":"b"}', b'{"u":"c"}'


@pytest.mark.parametrize(
    "then",
    [
        # what is between two series is not a comma: not JSON
        *(HEAD + series(A) + b"," + series(B) + sep + series(C) + b"]}}" for sep in (b"}", b" ")),
        # a time beyond a float (orjson refuses it; float() made it inf)
        HEAD + series(A) + b"," + series(B, time=b"1e400") + b"]}}",
        HEAD + series(A) + b"," + series(C, time=b"1" + b"0" * 400) + b"]}}",
    ],
)
def test_a_body_the_full_decoding_refuses_is_refused_not_mended(then: bytes) -> None:
    client = PrometheusClient(URL)
    client._decode("q", HEAD + series(A) + b"," + series(B) + b"]}}")
    with pytest.raises(ValueError):
        decode_answer(then, "q")
    with pytest.raises(ValueError):
        client._decode("q", then)


def test_an_answer_with_two_result_arrays_reads_the_last_as_the_full_decoding_does() -> None:
    """With a duplicate ``result`` key (orjson keeps the last), a head cut at the first
    ``"result":[`` would read the discarded array's series as the answer's: not mended."""
    known = b'{"status":"success","data":{"result":[0],"resultType":"vector","result":['
    then = b'{"status":"success","data":{"result":[' + series(A) + b',0],"resultType":"vector",'
    client = PrometheusClient(URL)
    client._decode("q", known + series(B) + b"]}}")
    body = then + b'"result":[' + series(B) + b"]}}"
    expected = list(parse_vector(orjson.loads(body)["data"]["result"], "q"))
    assert list(client._decode("q", body)) == expected == [Sample(freeze({"u": "b"}), 1.0, 1.0)]


def test_a_new_series_whose_metric_is_not_an_object_is_a_query_error() -> None:
    """The full decoding's verdict, not the mended one's: a series whose ``metric`` is a
    list is malformed (a mended answer would have taken it as labels)."""
    client = PrometheusClient(URL)
    client._decode("q", compact(({"uuid": "a"}, "1"), ({"uuid": "b"}, "2")))
    broken = compact(({"uuid": "a"}, "1"), ({"uuid": "b"}, "2")).replace(
        b'{"metric":{"uuid":"b"}', b'{"metric":["b"]'
    )
    with pytest.raises(QueryError, match="malformed series"):
        client._decode("q", broken)


def test_mended_answers_read_what_a_full_decoding_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A seeded walk through answers whose series come and go (a few or many at a time),
    whose values move and are now and then NaN or infinite, and whose label values hold
    what JSON escapes or what looks like a sample: every answer the client reads equals its
    full decoding, and most of them were mended."""
    mended = []
    mend = Answers._mended

    def counting(self: Answers, *args: Any) -> Any:
        known = mend(self, *args)
        mended.append(known is not None)
        return known

    monkeypatch.setattr(Answers, "_mended", counting)
    rng = random.Random(15)
    texts = ["u", 'q"x', "a\\b", "é\n", ',"value":[1,"2"]}', '{"metric":{']
    pool = [{"node": f"n{i}", "uuid": rng.choice(texts) + str(i)} for i in range(300)]
    client = PrometheusClient(URL)
    present = list(range(100))
    for step in range(300):
        for _ in range(rng.choice([0, 1, 1, 3, 5, 60])):
            if rng.random() < 0.5 and present:
                present.remove(rng.choice(present))
            else:
                present.append(rng.randrange(len(pool)))
        present = sorted(set(present))
        values = [
            rng.choice(["0.5", "1e-3", "+Inf", "-Inf", "-0", str(step)])
            if rng.random() > 0.001
            else "NaN"
            for _ in present
        ]
        series = [(pool[i], v) for i, v in zip(present, values, strict=True)]
        body = compact(*series, at=1.7e9 + step)
        expected = list(parse_vector(orjson.loads(body)["data"]["result"], "q"))
        assert list(client._decode("q", body)) == expected, step
    assert sum(mended) > 150 and not all(mended)  # both ways were taken


def test_a_time_that_is_not_json_is_not_read_by_the_fast_path() -> None:
    """A time of ``01`` (not JSON: the full decoding refuses it) is not split off as 1.0: the
    answer is refused as unreadable."""
    client = PrometheusClient(URL)
    client._decode("q", compact(({"uuid": "a"}, "1"), ({"uuid": "b"}, "2")))
    bad = compact(({"uuid": "a"}, "1"), ({"uuid": "b"}, "2"), at=1.0).replace(b"[1.0,", b"[01,")
    with pytest.raises(ValueError):
        client._decode("q", bad)


def test_a_nan_or_a_value_prometheus_would_not_write_takes_the_full_decoding() -> None:
    a, b = {"uuid": "a"}, {"uuid": "b"}
    client = PrometheusClient(URL)
    client._decode("q", compact((a, "1"), (b, "2")))
    assert list(client._decode("q", compact((a, "NaN"), (b, "3")))) == [
        Sample(freeze(b), 3.0, 1700000000.0)  # NaN left out
    ]
    client._decode("q", compact((a, "1"), (b, "2")))
    with pytest.raises(QueryError, match="not a number: ' 1'"):
        client._decode("q", compact((a, " 1"), (b, "2")))
