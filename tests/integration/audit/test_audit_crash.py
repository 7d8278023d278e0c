"""Crash survival: SIGKILL an engine process mid-stream; after a restart every
event it had acknowledged reaches the index, none twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from gpuops.audit import AuditLog, AuditSettings
from tests.fakes.fake_elasticsearch import FakeElasticsearch
from tests.unit.audit.factories import wait_until

REPO = Path(__file__).resolve().parents[3]
DECISIONS = "logs-gpuops.decision-default"

WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from gpuops.audit import AuditLog, AuditSettings
    from tests.unit.audit.factories import make_decision

    audit = AuditLog(
        AuditSettings(
            spool_dir=Path(sys.argv[1]), elasticsearch_url=sys.argv[2],
            segment_max_age_s=0.02, poll_interval_s=0.01, backoff_initial_s=0.01,
        ),
        host_name="victim",
    )
    audit.start()
    i = 0
    while True:  # until SIGKILL
        event_id = audit.decision(make_decision(labels={"node": "n1", "uuid": str(i)}), None)
        print(event_id, flush=True)  # printed only once acknowledged (fsync'd)
        i += 1
    """
)


def test_sigkill_mid_stream_loses_no_acknowledged_event_and_duplicates_none(
    tmp_path: Path,
) -> None:
    spool = tmp_path / "spool"
    with FakeElasticsearch() as es:
        es.delay_s = 0.002  # bulk requests are in flight when the kill comes
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with subprocess.Popen(
            [sys.executable, "-c", WRITER, str(spool), es.url],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
        ) as child:
            assert child.stdout is not None
            acknowledged: list[str] = []
            while len(acknowledged) < 3000 or not es.documents(DECISIONS):
                line = child.stdout.readline()
                assert line, "the writer died before the kill"
                acknowledged.append(line.strip())
            # The kill must leave acknowledged documents unshipped (a loaded machine's slow
            # writer was overtaken by its shipper: nothing left for the restart). From here
            # the fake refuses every bulk request (retried: 503); once the requests already
            # past that check have stored theirs, it stores nothing more, and the kill comes
            # as soon as an acknowledged document is not in the index.
            es.fail_next(503, times=100_000)
            wait_until(lambda: es.bulk_active == 0, timeout_s=30, what="bulk requests to end")
            shipped = set(es.ids(DECISIONS))
            while acknowledged[-1] in shipped:
                line = child.stdout.readline()
                assert line, "the writer died before the kill"
                acknowledged.append(line.strip())
            child.send_signal(signal.SIGKILL)
            acknowledged += [line.strip() for line in child.stdout if line.strip()]
            assert child.wait(10) == -signal.SIGKILL
        # bulk requests the dead engine had in flight (up to 3) finish storing first
        wait_until(lambda: not es.connections, timeout_s=30, what="the killed engine's requests")
        shipped_before = len(es.documents(DECISIONS))
        assert 0 < shipped_before < len(acknowledged)
        es.clear_faults()

        settings = AuditSettings(spool_dir=spool, elasticsearch_url=es.url, poll_interval_s=0.01)
        with AuditLog(settings, host_name="restarted") as audit:
            wait_until(lambda: audit.pending == 0, timeout_s=30, what="the spool to drain")
            created = audit.registry.get_sample_value(
                "gpuops_audit_shipped_documents_total", {"result": "created"}
            )
        stored = [d["event"]["id"] for d in es.documents(DECISIONS)]
    assert len(stored) == len(set(stored))
    assert set(acknowledged) <= set(stored)
    assert len(stored) - shipped_before == created  # the restart created only what was missing
    assert len(set(stored) - set(acknowledged)) <= 1  # at most the one being written at the kill
