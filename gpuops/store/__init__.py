"""The engine's state, from the bottom up: ``interface`` (the frozen values a backend hands back
and one repository Protocol per aggregate, joined in ``Store``) and ``errors`` (what a backend
raises); ``codecs`` (one JSON codec per stored type); ``sql`` (the queries both backends run,
one module per aggregate); the backends ``sqlite`` (the default: one file, schema migrations,
integrity checks) and ``postgres`` (shared by replicas, every write fenced); and ``lease``, the
leader lease of high availability (docs/ha.md)."""
