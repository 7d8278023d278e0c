"""A real, local Slurm cluster for tests: munged, slurmctld and several slurmd on one host."""
