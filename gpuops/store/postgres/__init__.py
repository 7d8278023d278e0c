"""The PostgreSQL backend, for replicas that share their state (docs/ha.md): ``store.PostgresStore``
(the queries of ``gpuops.store.sql``, every write fenced by the leader lease), ``schema`` and
``connection`` (credentials, and connections that name the server, never the password)."""

from gpuops.store.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
