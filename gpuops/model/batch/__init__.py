"""Batch operations as values: an operation (``operation``: its targets, the per-node
procedure, the canary, the budgets), read from its file (``opfile``), and its plan (``plan``:
the waves, the nodes skipped and why, the capacity kept, the expected duration).

Pure: ``gpuops batch plan`` and the engine's batch runner call these; nothing here acts.
"""
