"""The downgrade recipe of elk/README.md: ``sed -n 'n;p'`` (every second line) makes a format 1
segment of a format 2 one, with the same documents."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpuops.audit.spool import segment_paths
from tests.unit.audit.factories import doc, ids, make_spool


def test_every_second_line_of_a_segment_is_a_format_1_segment_of_the_same_documents(
    tmp_path: Path,
) -> None:
    spool, _ = make_spool(tmp_path / "new", max_bytes=100_000)
    spool.append_many([doc(n) for n in range(5)])
    spool.close()
    (segment,) = segment_paths(tmp_path / "new")
    old = tmp_path / "old"
    old.mkdir()
    with (old / segment.with_suffix(".jsonl").name).open("wb") as out:
        subprocess.run(["sed", "-n", "n;p", str(segment)], stdout=out, check=True)
    assert ids(old) == ids(tmp_path / "new") == [f"id-{n:04d}" for n in range(5)]
