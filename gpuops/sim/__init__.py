"""The simulator: ``fleet`` (a simulated GPU fleet with its scheduler, quotas, sharing and
energy model, exporting what real exporters export), ``whatif`` (a fleet file's workload run
without and with the policies in virtual time, and the two runs compared), the demos
(``demo`` with ``demo_report``, ``slurmdemo``), the local Slurm cluster (``slurmcluster``) and
the Helios history loader (``helios``).

The what-if and the demos sit over the fleet and the loaders; the fleet imports nothing of the
engine (it speaks Prometheus and HTTP). The import-linter contracts in pyproject.toml keep it
so.
"""
