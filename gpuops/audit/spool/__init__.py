"""The local audit spool, where every document is durable before anything else happens:
``segments`` (the files on disk, their two formats, their entries split), ``reader`` (the
documents read back, without the writer lock) and ``writer`` (``Spool``: fsync'd,
group-committed appends, sealing, the bound on its size)."""

from gpuops.audit.spool.reader import read_segment, read_spool
from gpuops.audit.spool.segments import Segment, segment_paths
from gpuops.audit.spool.writer import Spool

__all__ = ["Segment", "Spool", "read_segment", "read_spool", "segment_paths"]
