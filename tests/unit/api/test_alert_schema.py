"""An Alertmanager webhook item as the API validates it is what the alert inbox stores, key for
key. The receiver itself: tests/integration/api/test_alertmanager_receiver.py."""

from __future__ import annotations

import json

from gpuops.api.schemas import Alert as AlertIn
from gpuops.store.codecs import alert_doc, alert_from_doc


def test_an_alert_is_stored_as_the_webhook_sent_it() -> None:
    """The inbox's rows hold the validated webhook item's JSON, key for key and in its order
    (``gpuops.store.codecs.alert_doc``), and read back as the same value."""
    item = AlertIn.model_validate(
        {
            "status": "resolved",
            "labels": {"alertname": "GPUFellOffBus", "node": "n1"},
            "annotations": {"summary": "gone"},
            "startsAt": "2030-01-01T00:00:00Z",
            "endsAt": "2030-01-01T00:05:00Z",
            "generatorURL": "http://prometheus/graph",
            "fingerprint": "f1",
            "silencedBy": [],
        }
    )
    stored = alert_doc(item.value())
    assert list(stored.items()) == list(item.model_dump().items())
    assert alert_from_doc(json.loads(json.dumps(stored))) == item.value()
