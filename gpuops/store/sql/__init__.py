"""The queries both state backends run, one module per aggregate, in the SQL that SQLite and
PostgreSQL both speak: ``base`` (the connection, its lock, the transaction and the hooks of
what is cached), ``policy_states`` (with ``policy_seen``, the refresh of every target's
``last_seen`` and ``value`` in one row), ``guardrails``, ``decisions``, ``approvals``, ``quota``,
``alerts`` and ``controls``, joined in ``store.SqlStore``; ``columns`` writes the JSON text of
the rows written most often. Below ``gpuops.store.sqlite`` and ``gpuops.store.postgres``, above
``gpuops.store.codecs``."""
