#!/usr/bin/env bash
# The Flink peer's own virtualenv for benchmarks/flink_windows.py: apache-flink pins its
# own numpy/pandas/pyarrow, so it stays out of .venv. Flink's Parquet format needs
# flink-sql-parquet and Hadoop's client jars, fetched from Maven Central into
# .flink-venv/jars (flink_windows.py's --jars default). Needs python3, Java 17 and mvn.
set -euo pipefail
cd "$(dirname "$0")/.."
FLINK=2.3.0
HADOOP=3.3.6
python3 -m venv .flink-venv
.flink-venv/bin/pip install --quiet "apache-flink==$FLINK"
mkdir -p .flink-venv/jars
for artifact in "org.apache.flink:flink-sql-parquet:$FLINK" \
                "org.apache.hadoop:hadoop-client-api:$HADOOP" \
                "org.apache.hadoop:hadoop-client-runtime:$HADOOP"; do
  mvn --quiet dependency:copy -Dartifact="$artifact" -DoutputDirectory=.flink-venv/jars
done
ls .flink-venv/jars
