"""The alert inbox: Alertmanager alerts (``gpuops.model.alerts.Alert``) turned into decisions.

From the bottom up: ``waiting`` (the order queued alerts are decided in: the smallest
notification first, an alert's own notifications in order), ``batch`` (alerts decided together
and how their decisions and episodes are stored), ``deciding`` (what an alert decides: its
policies' actions, deduplicated by episode, a resolve undoing only what ran) and ``inbox``
(``AlertInbox``: the durable queue the receiver fills and the worker thread that empties it).
A collaborator of ``gpuops.runtime.facade.Engine``; its decisions go through the cycle's commit
and the gate like any other.
"""

from gpuops.runtime.alerts.inbox import BATCH, EPISODE_MEMORY_S, AlertInbox, InboxFull

__all__ = ["BATCH", "EPISODE_MEMORY_S", "AlertInbox", "InboxFull"]
