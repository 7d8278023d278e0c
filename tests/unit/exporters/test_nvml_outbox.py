"""The health pusher's queue on disk (``gpuops.exporters.nvml.outbox``): what one pusher queued
a new one reads back in order, bounded; a file that cannot be read is named and set aside; a
directory that cannot be used leaves the queue in memory. Nothing is sent here (no thread
starts): sending, and a restart against a running engine, are in
tests/integration/exporters/test_health_push.py."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from gpuops.exporters.nvml.outbox import SET_ASIDE, Outbox, OutboxError
from gpuops.exporters.nvml.push import HealthPusher


def pusher(queue_dir: Path | None, queue_size: int = 100) -> HealthPusher:
    return HealthPusher(
        "http://engine.invalid:9843", "t", "n1", queue_dir=queue_dir, queue_size=queue_size
    )


def queued_ids(push: HealthPusher) -> list[str]:
    return [event["id"] for event, _ in push._queue]


def files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_events_queued_by_one_pusher_are_read_back_in_order_by_the_next(tmp_path: Path) -> None:
    first = pusher(tmp_path / "q")
    first.xid("GPU-a", 79)
    first.lost("GPU-b")
    first.xid("GPU-a", 48)
    assert files(tmp_path / "q") == ["000000000001.json", "000000000002.json", "000000000003.json"]
    sent_by_first = queued_ids(first)
    second = pusher(tmp_path / "q")
    assert second.pending() == 3
    assert queued_ids(second) == sent_by_first  # the ids too: a resend is a duplicate
    assert [e.get("xid") for e, _ in second._queue] == [79, None, 48]
    second.xid("GPU-c", 94)  # after what it found, on disk too
    assert files(tmp_path / "q")[-1] == "000000000004.json"
    assert queued_ids(pusher(tmp_path / "q"))[:3] == sent_by_first


def test_without_a_queue_directory_the_queue_is_in_memory(tmp_path: Path) -> None:
    push = pusher(None)
    push.xid("GPU-a", 79)
    assert push.outbox is None and push.pending() == 1
    assert not list(tmp_path.iterdir())


def test_the_bound_drops_the_oldest_event_and_its_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    push = pusher(tmp_path, queue_size=2)
    for code in (13, 31, 43):
        push.xid("GPU-a", code)
    assert push.pending() == 2 and push.dropped == 1
    assert [e["xid"] for e, _ in push._queue] == [31, 43]
    assert files(tmp_path) == ["000000000002.json", "000000000003.json"]
    assert "health event queue full (2): the oldest event n1-" in caplog.text
    assert [r.levelno for r in caplog.records if "queue full" in r.message] == [logging.WARNING]
    smaller = pusher(tmp_path, queue_size=1)  # restarted with a smaller queue
    assert [e["xid"] for e, _ in smaller._queue] == [43] and smaller.dropped == 1
    assert files(tmp_path) == ["000000000003.json"]


def test_a_file_that_cannot_be_read_is_named_set_aside_and_the_rest_sent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = pusher(tmp_path)
    for code in (79, 48, 94):
        first.xid("GPU-a", code)
    (tmp_path / "000000000002.json").write_text('{"id": "n1-x-2", "node"', encoding="utf-8")
    (tmp_path / "000000000003.json").write_text('["n1"]', encoding="utf-8")
    (tmp_path / ".000000000004.json.tmp").write_text("{", encoding="utf-8")  # a torn write
    (tmp_path / "000000000005.json").write_text(
        json.dumps({"id": "n1-x-5", "node": "n1", "kind": "gpu_lost", "gpu": "GPU-b"}),
        encoding="utf-8",
    )
    with caplog.at_level(logging.INFO):
        second = pusher(tmp_path)
    assert [e["id"] for e, _ in second._queue] == [queued_ids(first)[0], "n1-x-5"]
    assert second.dropped == 2
    assert files(tmp_path) == [
        "000000000001.json",
        "000000000002.json" + SET_ASIDE,
        "000000000003.json" + SET_ASIDE,
        "000000000005.json",
    ]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [
        f"health event file {tmp_path / '000000000002.json'} cannot be read (not JSON: "
        "Expecting ':' delimiter: line 1 column 24 (char 23)): set aside as "
        f"000000000002.json{SET_ASIDE}, not sent",
        f"health event file {tmp_path / '000000000003.json'} cannot be read (not a JSON "
        f"object but list): set aside as 000000000003.json{SET_ASIDE}, not sent",
    ]
    second.xid("GPU-a", 13)  # numbered after every file it saw
    assert files(tmp_path)[-1] == "000000000006.json"


def test_an_event_without_an_id_is_not_read_back(tmp_path: Path) -> None:
    (tmp_path / "000000000001.json").write_text('{"node": "n1", "kind": "xid"}', "utf-8")
    assert Outbox(tmp_path).load() == ([], 1)
    assert files(tmp_path) == ["000000000001.json" + SET_ASIDE]


def test_a_directory_that_cannot_be_used_leaves_the_queue_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("", encoding="utf-8")
    push = pusher(blocked / "q")
    assert push.outbox is None
    push.xid("GPU-a", 79)
    assert push.pending() == 1
    figures = {m.name: m.samples[0].value for m in push.collect()}
    assert figures["nvml_agent_health_queue_on_disk"] == 0
    assert figures["nvml_agent_health_events_queued"] == 1
    assert f"cannot keep health events in {blocked / 'q'}: " in caplog.text
    assert "health events are queued in memory only, lost if the agent stops" in caplog.text


def test_an_event_that_cannot_be_written_is_kept_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    push = pusher(tmp_path / "q")
    (tmp_path / "q").rmdir()
    (tmp_path / "q").write_text("", encoding="utf-8")  # the directory replaced by a file
    push.xid("GPU-a", 79)
    assert push.pending() == 1
    [(event, name)] = push._queue
    assert name is None
    assert f"cannot write health event {event['id']} to {tmp_path / 'q'}: " in caplog.text
    with pytest.raises(OutboxError, match="cannot keep health events in"):
        Outbox(tmp_path / "q").load()
    push.lost("GPU-b")  # a full disk: said once, not at every event
    push.xid("GPU-a", 48)
    assert push.pending() == 3
    assert [r.levelname for r in caplog.records if "cannot write" in r.message] == ["ERROR"]
    figures = {m.name: m.samples[0].value for m in push.collect()}
    assert figures["nvml_agent_health_queue_on_disk"] == 0
    (tmp_path / "q").unlink()
    (tmp_path / "q").mkdir()  # the disk takes events again
    push.xid("GPU-a", 13)
    assert files(tmp_path / "q") == ["000000000001.json"]
    assert f"health events are written to {tmp_path / 'q'} again" in caplog.text
    figures = {m.name: m.samples[0].value for m in push.collect()}
    assert figures["nvml_agent_health_queue_on_disk"] == 1


def test_the_sender_and_metrics_do_not_wait_for_an_event_being_written(tmp_path: Path) -> None:
    push = pusher(tmp_path / "q")
    assert push.outbox is not None
    writing, done = threading.Event(), threading.Event()
    add = push.outbox.add

    def slow_disk(event: dict[str, Any]) -> str:
        writing.set()
        done.wait(10)
        return add(event)

    push.outbox.add = slow_disk  # type: ignore[method-assign]
    putting = threading.Thread(target=push.xid, args=("GPU-a", 79))
    putting.start()
    try:
        assert writing.wait(10)
        asking = threading.Thread(target=lambda: (push.pending(), list(push.collect())))
        asking.start()
        asking.join(5)
        assert not asking.is_alive()  # answered while the event is being flushed to disk
        assert push.pending() == 0
    finally:
        done.set()
        putting.join(10)
    assert push.pending() == 1 and files(tmp_path / "q") == ["000000000001.json"]
