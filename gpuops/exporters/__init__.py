"""The exporters gpuops ships: ``nvml`` (GPU metrics, XID events and the node agent that applies
clock caps) and ``slurm`` (nodes, jobs, queues). They speak Prometheus and HTTP and never
import the engine."""
