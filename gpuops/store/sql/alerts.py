"""The Alertmanager alerts' repository: the durable inbox of received alerts (``alert_inbox``,
kept until handled, so a crash loses none), the handled episodes (``alert_episodes``: a retried
webhook or a resend is known) and the resolves that came before their firing's action
succeeded (``early_resolves``). Alerts are stored as Alertmanager sent them
(``gpuops.store.codecs.alert_doc``). Part of ``gpuops.store.sql.store.SqlStore``; used by the
API's receiver and ``gpuops.runtime.alerts``.

One bad row never stops the rest: a stored alert whose status is neither firing nor resolved is
handled as resolved (as the inbox always did), one that cannot be decoded at all is left where
it is (logged, and reported by ``gpuops state check``: ``alert_row_problems``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from gpuops.model.alerts import Alert
from gpuops.store.codecs import alert_doc, alert_from_doc, alert_status_problem
from gpuops.store.interface import AlertKey, InboxItem
from gpuops.store.sql.base import CHUNK, SqlBase

log = logging.getLogger(__name__)

_SHOWN = 200
"""How much of a bad row a log line or a problem quotes."""


class SqlAlerts(SqlBase):
    """``gpuops.store.interface.AlertRepository`` in SQL."""

    def inbox_add(self, alerts: Sequence[Alert], now: float) -> list[int]:
        """Keep received alerts on disk until handled (the receiver answers after this)."""
        with self.transaction() as db:
            return [
                int(
                    db.execute(
                        "INSERT INTO alert_inbox (received_at, alert) VALUES (?, ?) RETURNING id",
                        (now, json.dumps(alert_doc(alert))),
                    ).fetchone()[0]
                )
                for alert in alerts
            ]

    def inbox(self) -> list[InboxItem]:
        """Alerts received but not handled yet, oldest first (after a crash: to handle now)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, alert, received_at FROM alert_inbox ORDER BY id"
            ).fetchall()
        items = []
        for row_id, text, received_at in rows:
            alert = self._stored_alert("alert_inbox", row_id, text)
            if alert is not None:
                items.append(InboxItem(int(row_id), alert, float(received_at)))
        return items

    def inbox_done(self, item: int) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM alert_inbox WHERE id = ?", (item,))

    def alerts_handled(self, keys: Sequence[AlertKey], items: Sequence[int], now: float) -> None:
        """Record the episodes ``keys`` and take ``items`` out of the inbox, in one transaction
        (one fsync for a batch of the inbox's worker, not two an alert)."""
        with self.transaction() as db:
            if keys:
                db.executemany(
                    "INSERT INTO alert_episodes VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    [(k.fingerprint, k.starts_at, k.status, now) for k in keys],
                )
            if items:
                db.executemany("DELETE FROM alert_inbox WHERE id = ?", [(i,) for i in items])

    def known_alerts(self, keys: Sequence[AlertKey]) -> set[AlertKey]:
        """Those of ``keys`` recorded (``alert_known`` of many, one query per ``CHUNK``
        fingerprints)."""
        wanted = set(keys)
        fingerprints = sorted({k.fingerprint for k in wanted})
        found: set[AlertKey] = set()
        with self._lock:
            for start in range(0, len(fingerprints), CHUNK):
                chunk = fingerprints[start : start + CHUNK]
                rows = self._db.execute(
                    "SELECT fingerprint, starts_at, status FROM alert_episodes"
                    f" WHERE fingerprint IN ({','.join('?' * len(chunk))})",
                    chunk,
                ).fetchall()
                found.update(k for r in rows if (k := AlertKey(r[0], r[1], r[2])) in wanted)
        return found

    def alert_known(self, key: AlertKey) -> bool:
        with self._lock:
            row = self._db.execute(
                "SELECT 1 FROM alert_episodes WHERE fingerprint = ? AND starts_at = ?"
                " AND status = ?",
                (key.fingerprint, key.starts_at, key.status),
            ).fetchone()
        return row is not None

    def prune_alert_episodes(self, older_than: float) -> int:
        """Forget handled alert episodes, and resolves whose fire never came, older than
        ``older_than``; returns how many rows went."""
        with self.transaction() as db:
            gone = db.execute("DELETE FROM alert_episodes WHERE seen_at < ?", (older_than,))
            early = db.execute("DELETE FROM early_resolves WHERE at < ?", (older_than,))
            return int(gone.rowcount) + int(early.rowcount)

    def seen_alert(self, key: AlertKey, now: float) -> bool:
        """Record an alert episode; True when it was already recorded (a retried webhook)."""
        with self.transaction() as db:
            cur = db.execute(
                "INSERT INTO alert_episodes VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (key.fingerprint, key.starts_at, key.status, now),
            )
            return cur.rowcount == 0

    def forget_alert(self, key: AlertKey) -> None:
        with self.transaction() as db:
            db.execute(
                "DELETE FROM alert_episodes WHERE fingerprint = ? AND starts_at = ? AND status = ?",
                (key.fingerprint, key.starts_at, key.status),
            )

    # --- resolves that came early ---------------------------------------------------------
    def save_early_resolve(self, fire_id: str, alert: Alert, now: float) -> None:
        """Remember a resolved alert whose firing's action (``fire_id``) has not succeeded yet."""
        with self.transaction() as db:
            db.execute(
                "INSERT INTO early_resolves VALUES (?, ?, ?)"
                " ON CONFLICT (fire_id) DO UPDATE SET alert = excluded.alert, at = excluded.at",
                (fire_id, json.dumps(alert_doc(alert)), now),
            )

    def take_early_resolve(self, fire_id: str) -> Alert | None:
        """The resolved alert waiting for ``fire_id`` (removed: it is handled once). A row that
        cannot be decoded stays (logged; ``gpuops state check`` reports it, the prune of old
        episodes removes it) and reads as none."""
        with self.transaction() as db:
            row = db.execute(
                "SELECT alert FROM early_resolves WHERE fire_id = ?", (fire_id,)
            ).fetchone()
            if row is None:
                return None
            alert = self._stored_alert("early_resolves", fire_id, row[0])
            if alert is not None:
                db.execute("DELETE FROM early_resolves WHERE fire_id = ?", (fire_id,))
        return alert

    def _stored_alert(self, table: str, key: object, text: str) -> Alert | None:
        """The alert of one row of ``table``: a status neither firing nor resolved as resolved
        (logged); None, logged, when the row cannot be decoded at all."""
        try:
            doc = json.loads(text)
            alert = alert_from_doc(doc, unknown_status_resolved=True)
        except (ValueError, TypeError) as exc:
            log.error(
                "%s: %s row %s cannot be decoded (%s: %s), left as it is (gpuops state check"
                " reports it): %.*s",
                self.path,
                table,
                key,
                type(exc).__name__,
                exc,
                _SHOWN,
                text,
            )
            return None
        problem = alert_status_problem(doc)
        if problem is not None:
            log.warning(
                "%s: %s row %s: %s; handled as resolved: %.*s",
                self.path,
                table,
                key,
                problem,
                _SHOWN,
                text,
            )
        return alert

    def alert_row_problems(self) -> list[str]:
        """What is wrong with the stored alerts (``alert_inbox``, ``early_resolves``), one line
        a row, for ``gpuops state check``; changes no row."""
        with self._lock:
            inbox = self._db.execute("SELECT id, alert FROM alert_inbox ORDER BY id").fetchall()
            early = self._db.execute(
                "SELECT fire_id, alert FROM early_resolves ORDER BY fire_id"
            ).fetchall()
        problems = []
        for table, rows, then in (
            ("alert_inbox", inbox, "the engine leaves it in the inbox"),
            ("early_resolves", early, "the engine never handles it"),
        ):
            for key, text in rows:
                where = f"{self.path}: {table} row {key}"
                try:
                    doc = json.loads(text)
                    alert_from_doc(doc, unknown_status_resolved=True)
                except (ValueError, TypeError) as exc:
                    problems.append(
                        f"{where} cannot be decoded ({type(exc).__name__}: {exc}; it starts"
                        f" {str(text)[:80]!r}): {then}"
                    )
                    continue
                problem = alert_status_problem(doc)
                if problem is not None:
                    problems.append(f"{where}: {problem}: the engine handles it as resolved")
        return problems
