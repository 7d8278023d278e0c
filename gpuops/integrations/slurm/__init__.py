"""Slurm: ``client`` is the one place that runs Slurm's commands (argv, timeouts, temporary and
permanent errors); ``nodes`` reads a node's state; ``gres`` reads gres.conf (which device each
GPU index is). Used by the Slurm exporter, the ``slurm`` executor and the job-event watcher
(docs/slurm.md)."""
