"""A checkpoint file Spark fails to write on a full disk is closed when Spark cancels it
(`engine.spark.session.write_local_files_without_checksums`). With the checksum files
Hadoop's `file:` filesystem writes by default, the file stayed open after Spark deleted
it: its space stayed taken on the full disk, and the disk could not be remounted
read-only, until a garbage collection reached the stream. Mounting the small disk needs
root: elsewhere the test is skipped, saying so."""

from __future__ import annotations

from functools import reduce

import pytest

from engine.spark.session import CHECKPOINT_FILE_MANAGER
from tests.disks import fill, open_files, small_disk


@pytest.mark.spark
def test_a_checkpoint_file_that_cannot_be_written_is_closed(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    with small_disk(tmp_path / "disk", "1m") as disk:
        fill(disk)
        target = jvm.org.apache.hadoop.fs.Path(f"file://{disk}/state/1.changelog")
        manager = reduce(getattr, CHECKPOINT_FILE_MANAGER.split("."), jvm)(target.getParent(), conf)
        out = manager.createAtomic(target, True)
        out.write(bytearray(100))  # buffered: the failure comes as the file is closed
        out.cancel()  # what the state store does with a changelog it could not write
        jvm_files = [
            f for f in open_files(disk) if f.startswith(f"{jvm.ProcessHandle.current().pid()} ")
        ]
        assert not jvm_files, jvm_files
