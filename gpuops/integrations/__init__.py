"""Clients of the systems gpuops acts on, shared by its exporters and executors."""
