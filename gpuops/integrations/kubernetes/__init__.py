"""Kubernetes: ``names`` holds every label, annotation, taint and node condition gpuops reads or
writes and the RBAC rules of the calls it makes; ``client`` is the one place that calls the API
server (the official ``kubernetes`` client, rate limited, its errors mapped to gpuops' own).
Used by the ``kubernetes`` executor (``gpuops.actions.kubernetes``), the rule checks and the
manifests of deploy/kubernetes (docs/kubernetes.md)."""
