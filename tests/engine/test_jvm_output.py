"""The engine's output filter drops Spark's start-up chatter (Ivy's report, log4j's
greeting, PySpark's worker banners) from a real engine log, and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from engine.spark.jvm_output import LineFilter, is_noise

START = (Path(__file__).parent / "data" / "engine_start.log").read_text()
"""The first lines of `lookout engine`'s log at 20k readings/s, up to its first batch."""

KEPT = [line for line in START.splitlines() if " lookout.engine INFO " in line]
"""What an operator needs from it: the engine's own lines (rules loaded, metrics,
the parts of the rules, running)."""


@given(st.lists(st.integers(1, 400), max_size=30))
def test_a_real_start_keeps_only_the_engines_lines_however_it_is_cut(cuts) -> None:
    lines = LineFilter()
    out, at = "", 0
    for size in cuts:
        out += lines.feed(START[at : at + size])
        at += size
    out += lines.feed(START[at:])
    assert len(KEPT) == 7
    assert out.splitlines() == KEPT


def test_warnings_errors_and_tracebacks_pass_unchanged() -> None:
    text = (
        "26/11/28 13:40:01 WARN RocksDB: slow commit\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "ValueError: one\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        "26/11/28 13:40:02 ERROR MicroBatchExecution: Query engine terminated with error\n"
        ":: UNRESOLVED DEPENDENCIES ::\n"
        "\t:: io.delta#delta-spark_4.2_2.13;9.9.9: not found\n"
    )
    assert LineFilter().feed(text) == text
    assert not is_noise("\t:: io.delta#delta-spark_4.2_2.13;9.9.9: not found")


def test_the_engine_process_output_goes_through_the_filter(tmp_path) -> None:
    """In a process that called `filter_output`, a child's noise is dropped and the
    parent's last words before exit still arrive."""
    script = tmp_path / "run.py"
    script.write_text(
        "import subprocess, sys\n"
        "from engine.spark.jvm_output import filter_output\n"
        "filter_output()\n"
        "subprocess.run(['bash', '-c', \"echo 'Starting Streaming TransformWithStateInPandas"
        " Python worker.'; echo; echo kept; echo 'Ivy Default Cache set to: /x' >&2\"])\n"
        "print('last words', file=sys.stderr)\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.stdout == "kept\n"
    assert done.stderr == "last words\n"
