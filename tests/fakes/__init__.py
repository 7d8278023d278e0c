"""Faithful fakes of the services gpuops talks to, served on loopback ports for tests."""
