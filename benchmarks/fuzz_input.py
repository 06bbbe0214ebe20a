"""Long fuzzing run over bad input: payloads and rule text.

    .venv/bin/python benchmarks/fuzz_input.py [--payloads N] [--batches N] [--rules N]
        [--renamed N] [--grammar N] [--bytes N] [--text N] [--seed S]

Runs the properties of `tests/fuzz/` for many more examples than the test suite does:
payloads through `Validator.validate`, then the `LandingWriter` -> the engine's reader
and sequencing round trip; rule text (mutated library files, renamed ones whose names and numbers
changed so the checker sees them, library files with non-UTF-8 bytes, grammar-generated
and arbitrary text) through `parse_text` / `check_paths`. A failing example does not
stop the run: each distinct finding (exception type and where it was raised) is printed
once with its first input. Prints examples/s per target; exits 1 if anything was found.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from ingest.validate import Validator
from tests.fuzz.payloads import (
    NOW_MS,
    check_landing,
    check_message,
    library_streams,
    messages,
)
from tests.fuzz.rule_text import (
    check_rule_bytes,
    check_rule_file,
    grammar_text,
    mutated_library,
    non_utf8_library,
    semantic_mutations,
)


@dataclass
class Target:
    """One fuzz target's tally."""

    name: str
    examples: int = 0
    seconds: float = 0.0
    findings: dict[str, tuple[str, Any]] = field(default_factory=dict)


def _key(exc: BaseException) -> str:
    """A finding's identity: its exception type and the innermost frame in the repo."""
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__) if "site-packages" not in f.filename
    ]
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
    return f"{type(exc).__name__} at {where}"


def run(
    target: Target,
    strategy: st.SearchStrategy[Any],
    check: Callable[[Any], None],
    examples: int,
    seed_value: int,
) -> None:
    """Draw `examples` inputs from `strategy` and `check` each, collecting failures."""

    @seed(seed_value)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def body(value: Any) -> None:
        target.examples += 1
        try:
            check(value)
        except Exception as exc:  # a finding: record it, keep fuzzing
            target.findings.setdefault(_key(exc), (f"{type(exc).__name__}: {exc}"[:300], value))

    start = time.perf_counter()
    body()
    target.seconds += time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    """Run every target and print a table of examples, rate and findings."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--payloads", type=int, default=20_000, help="single messages")
    parser.add_argument("--batches", type=int, default=2_000, help="landed runs of messages")
    parser.add_argument("--rules", type=int, default=5_000, help="mutated library files")
    parser.add_argument("--renamed", type=int, default=5_000, help="renamed library files")
    parser.add_argument("--grammar", type=int, default=2_000, help="grammar-generated files")
    parser.add_argument("--bytes", type=int, default=1_000, help="non-UTF-8 library files")
    parser.add_argument("--text", type=int, default=5_000, help="arbitrary text files")
    parser.add_argument("--seed", type=int, default=8)
    args = parser.parse_args(argv)

    validator = Validator(library_streams(), max_payload_bytes=2_000)
    folder = Path(tempfile.mkdtemp(prefix="lookout-fuzz-"))

    def one_message(message: Any) -> None:
        check_message(
            validator, message, validator.validate(message.topic, message.payload, NOW_MS)
        )

    def landed(batch: Any) -> None:
        results = [(m, validator.validate(m.topic, m.payload, NOW_MS)) for m in batch]
        for message, result in results:
            check_message(validator, message, result)
        check_landing(validator, results)

    def rule_file(case: tuple[str, str]) -> None:
        check_rule_file(folder / case[0], case[1])

    def generated(text: str) -> None:
        check_rule_file(folder / "generated.sql", text)

    def not_utf8(case: tuple[str, bytes]) -> None:
        assert check_rule_bytes(folder / case[0], case[1])

    def any_text(text: str) -> None:
        check_rule_file(folder / "any.sql", text.encode("utf-8", "replace").decode("utf-8"))

    targets = [
        (Target("payload -> validate"), messages(validator.streams), one_message, args.payloads),
        (
            Target("payloads -> land -> split"),
            st.lists(messages(validator.streams), min_size=1, max_size=12),
            landed,
            args.batches,
        ),
        (Target("mutated rules/*.sql"), mutated_library(), rule_file, args.rules),
        (Target("renamed rules/*.sql"), semantic_mutations(), rule_file, args.renamed),
        (Target("grammar-generated rules"), grammar_text(), generated, args.grammar),
        (Target("non-UTF-8 rules/*.sql"), non_utf8_library(), not_utf8, args.bytes),
        (Target("arbitrary rule text"), st.text(max_size=200), any_text, args.text),
    ]
    print(f"{'target':28} {'examples':>9} {'seconds':>8} {'examples/s':>11} findings")
    found = 0
    for target, strategy, check, examples in targets:
        if examples <= 0:
            continue
        run(target, strategy, check, examples, args.seed)
        rate = target.examples / target.seconds if target.seconds else 0.0
        print(
            f"{target.name:28} {target.examples:9d} {target.seconds:8.1f} {rate:11.0f} "
            f"{len(target.findings)}",
            flush=True,
        )
        for key, (message, value) in target.findings.items():
            found += 1
            print(f"  FINDING {key}\n    {message}\n    input: {value!r:.600}")
    shutil.rmtree(folder, ignore_errors=True)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
