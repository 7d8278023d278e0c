"""The simulator: ``fleet`` (a simulated GPU fleet with its scheduler, quotas, sharing and
energy model, exporting what real exporters export), ``whatif`` (a fleet file's workload run
without and with the policies in virtual time), the demos (``demo``, ``slurmdemo``), the local
Slurm cluster (``slurmcluster``) and the Helios history loader (``helios``)."""
