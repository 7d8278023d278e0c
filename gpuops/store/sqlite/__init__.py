"""The SQLite backend, the default: ``store.StateStore`` (the queries of ``gpuops.store.sql`` on
one file), ``schema`` (its tables and numbered migrations) and ``integrity`` (the checks that
refuse a file that cannot be trusted, and ``reset``, which puts one aside)."""

from gpuops.store.sqlite.store import StateStore

__all__ = ["StateStore"]
