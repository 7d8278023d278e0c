"""GPU health as values: the XID catalogue (``catalogue``, read from files by
``catalogue_file``) and which XID events make a GPU faulty (``faults``).

Pure: the engine's health inbox and the CLI call these; nothing here acts.
"""
