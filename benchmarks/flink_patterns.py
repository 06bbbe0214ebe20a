"""Flink SQL's MATCH_RECOGNIZE over given rows: the peer the row-pattern tests compare
Lookout's matches with (`tests/rules/test_match_recognize_flink.py`).

Runs in the Flink virtualenv (`benchmarks/flink_setup.sh` makes `.flink-venv`), one JVM
for every query: the rows go to a CSV file read as the table

    md (station INT, speed INT, n INT, ts BIGINT,
        rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt)

(the file in (ts, n) order, so no row is late; MATCH_RECOGNIZE orders by ``rt, n``) in
streaming mode at parallelism 1, and each query's rows are collected (the bounded
source's final watermark closes every WITHIN). Reads a JSON spec,
``{"rows": [[station, speed, n, ts], ...], "queries": {name: sql, ...}}``, and prints
one line starting with RESULT_TAG: ``{name: {"rows": [[...], ...]}}``, or
``{name: {"error": message}}`` for a query Flink refuses.

    .flink-venv/bin/python benchmarks/flink_patterns.py SPEC.json

`patterns(rows, queries)` runs it from Lookout's own virtualenv, as a subprocess.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

RESULT_TAG = "FLINK_PATTERNS "
SCRIPT = Path(__file__).resolve()


def patterns(
    rows: list[tuple[int, int, int, int]], queries: dict[str, str], python: Path
) -> dict[str, dict[str, list]]:
    """Every query's result rows (or its error) from Flink, run by ``python`` (the Flink
    virtualenv's); a failure of the run itself is raised as RuntimeError."""
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps({"rows": rows, "queries": queries}))
        done = subprocess.run([str(python), str(SCRIPT), str(spec)], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{SCRIPT.name} failed ({done.returncode}): {done.stderr[-3000:]}")
    tagged = [line for line in done.stdout.splitlines() if line.startswith(RESULT_TAG)]
    if not tagged:
        raise RuntimeError(f"{SCRIPT.name} printed no result:\n{done.stdout[-3000:]}")
    result: dict[str, dict[str, list]] = json.loads(tagged[-1].removeprefix(RESULT_TAG))
    return result


def main() -> None:
    from pyflink.table import EnvironmentSettings, TableEnvironment

    spec = json.loads(Path(sys.argv[1]).read_text())
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    env.get_config().set("parallelism.default", "1")
    env.get_config().set("table.local-time-zone", "UTC")
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / "md.csv"
        # In (ts, n) order: the source reads the file in order, so no row is late.
        ordered = sorted(spec["rows"], key=lambda r: (r[3], r[2]))
        csv.write_text("".join(f"{k},{v},{n},{ts}\n" for k, v, n, ts in ordered))
        env.execute_sql(
            "CREATE TABLE md (station INT, speed INT, n INT, ts BIGINT,"
            " rt AS TO_TIMESTAMP_LTZ(ts, 3), WATERMARK FOR rt AS rt - INTERVAL '1' SECOND)"
            f" WITH ('connector' = 'filesystem', 'path' = '{csv}', 'format' = 'csv')"
        )
        out: dict[str, dict[str, list]] = {}
        for name, sql in spec["queries"].items():
            try:
                with env.execute_sql(sql).collect() as result:
                    out[name] = {"rows": [list(row) for row in result]}
            except Exception as e:  # a query Flink refuses: its reason, not the run's end
                message = str(e).splitlines()
                out[name] = {"error": next((m for m in message if "Exception" in m), str(e))}
    print(RESULT_TAG + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
