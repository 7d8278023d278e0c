"""Slurm: the metrics source (``gpuops exporter slurm``) and the CLI client the ``slurm``
executor shares. Talks to slurmctld only through its commands (``sinfo``/``squeue``/``scontrol``
with ``--json`` where 22.05 has it), each with a timeout; never imports the engine."""
