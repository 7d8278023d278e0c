"""The Slurm exporter (``gpuops exporter slurm``): nodes, jobs and queues as Prometheus series,
read through ``gpuops.integrations.slurm.client``; never imports the engine."""
