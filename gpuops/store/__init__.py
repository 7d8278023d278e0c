"""The engine's state: ``interface`` (the repository Protocols and the frozen values they hand
back), ``codecs`` (one JSON codec per stored type), ``sqlite`` (the default backend: one file,
schema migrations, integrity checks) and ``postgres`` (the same on PostgreSQL, with the leader
lease for high availability: docs/ha.md)."""
