"""What a rule may reach: table files only inside the rule folders (never a device, a
FIFO or a file outside, whatever the path or link says), of a bounded size, with no
file content in an error; Delta tables there or in the lakehouse; Python aggregates only
from modules in the rule folders or allowed by the installation, refused without being
imported."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rules.language.access import RulePolicy
from rules.language.loader import RULES_DIR, check_paths, load_rules

REPO = Path(__file__).resolve().parents[2]
TABLE = "CREATE TABLE t (a STRING) FROM {fmt} '{path}';\n"


def table_rule(folder: Path, path: str | Path, fmt: str = "CSV") -> Path:
    """A rule file in `folder` declaring a table read from `path`."""
    folder.mkdir(parents=True, exist_ok=True)
    rule = folder / "r.sql"
    rule.write_text(TABLE.format(fmt=fmt, path=path))
    return rule


def check_in_subprocess(rule: Path, code: str = "", timeout: float = 60) -> str:
    """Check `rule` in a child process with 1 GiB of address space and a deadline, so
    that a rule reading an endless file fails the test instead of the machine; returns
    the errors it prints (then whatever `code` prints)."""
    script = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        from rules.language.loader import check_paths
        for error in check_paths([{str(rule)!r}]):
            print(error)
        {code}
    """)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "LOOKOUT_TEST_SECRET": "hunter2-secret"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_proc_self_environ_is_refused_and_not_echoed(tmp_path: Path) -> None:
    out = check_in_subprocess(table_rule(tmp_path / "rules", "/proc/self/environ"))
    assert (
        "r.sql:1:36: cannot load table 't': '/proc/self/environ' is outside the rule folders" in out
    )
    assert "hunter2-secret" not in out and "PATH=" not in out


def test_dev_zero_is_refused_at_once(tmp_path: Path) -> None:
    out = check_in_subprocess(table_rule(tmp_path / "rules", "/dev/zero"), timeout=30)
    assert "'/dev/zero' is outside the rule folders" in out


@pytest.mark.parametrize("written", ["../outside.csv", "sub/../../outside.csv"])
def test_a_path_escaping_the_folder_is_refused(tmp_path: Path, written: str) -> None:
    (tmp_path / "outside.csv").write_text("a\nsecret-value\n")
    (tmp_path / "rules" / "sub").mkdir(parents=True)
    errors = check_paths([table_rule(tmp_path / "rules", written)])
    assert [e.message for e in errors] == [
        f"cannot load table 't': '{written}' is outside the rule folders ({tmp_path / 'rules'}); "
        "a table file must be inside them"
    ]


def test_a_link_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (tmp_path / "outside.csv").write_text("a\nsecret-value\n")
    (rules / "inside.csv").symlink_to(tmp_path / "outside.csv")
    (rules / "zero.csv").symlink_to("/dev/zero")
    for name in ("inside.csv", "zero.csv"):
        (error,) = check_paths([table_rule(rules, name)])
        assert f"'{name}' is outside the rule folders" in error.message
        assert "secret-value" not in error.format()


def test_a_fifo_in_the_folder_is_refused_without_blocking(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    os.mkfifo(rules / "pipe.csv")  # nobody writes: reading it would wait forever
    out = check_in_subprocess(table_rule(rules, "pipe.csv"), timeout=30)
    assert f"'{rules / 'pipe.csv'}' is not a regular file" in out


def test_a_table_file_larger_than_the_limit_is_refused(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "big.csv").write_text("a\n" + "x" * 100 + "\n")
    rule = table_rule(rules, "big.csv")
    assert check_paths([rule], RulePolicy(max_table_bytes=200)) == []
    (error,) = check_paths([rule], RulePolicy(max_table_bytes=100))
    assert error.message == (
        f"cannot load table 't': '{rules / 'big.csv'}' is larger than the 100 bytes a table "
        "file may have ([rules] max_table_bytes in lookout.toml)"
    )


def test_a_missing_column_does_not_show_the_header(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "t.csv").write_text("password,b\nx,y\n")
    (error,) = check_paths([table_rule(rules, "t.csv")])
    assert error.message.endswith("t.csv' has no column 'a' in its header row")
    assert "password" not in error.format()


def test_delta_tables_only_from_the_rule_folders_or_the_lakehouse(tmp_path: Path) -> None:
    deltalake = pytest.importorskip("deltalake")
    pa = pytest.importorskip("pyarrow")
    lakehouse, elsewhere = tmp_path / "lakehouse", tmp_path / "elsewhere"
    for folder in (lakehouse / "codes", elsewhere / "codes"):
        deltalake.write_deltalake(str(folder), pa.table({"a": ["x", "y"]}))
    rule = table_rule(tmp_path / "rules", elsewhere / "codes", "DELTA")
    (error,) = check_paths([rule], RulePolicy(delta_roots=(str(lakehouse),)))
    assert f"'{elsewhere / 'codes'}' is neither inside the rule folders" in error.message
    assert f"nor in the lakehouse ({lakehouse})" in error.message
    rule = table_rule(tmp_path / "rules", lakehouse / "codes", "DELTA")
    assert check_paths([rule], RulePolicy(delta_roots=(str(lakehouse),))) == []
    assert check_paths([rule])  # no lakehouse named: refused


def test_a_delta_table_larger_than_the_limit_is_refused(tmp_path: Path) -> None:
    deltalake = pytest.importorskip("deltalake")
    pa = pytest.importorskip("pyarrow")
    deltalake.write_deltalake(str(tmp_path / "rules" / "codes"), pa.table({"a": ["x"] * 1000}))
    rule = table_rule(tmp_path / "rules", "codes", "DELTA")
    assert check_paths([rule]) == []
    (error,) = check_paths([rule], RulePolicy(max_table_bytes=100))
    assert "bytes of data files, more than the 100 a table may have" in error.message


AGGREGATE = "CREATE AGGREGATE f(x INT) RETURNS INT LANGUAGE PYTHON AS '{target}';\n"


def test_a_module_outside_the_rule_folders_is_refused_without_importing_it(
    tmp_path: Path,
) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "r.sql").write_text(AGGREGATE.format(target="this:Zen"))
    out = check_in_subprocess(rules / "r.sql", "print('imported:', 'this' in sys.modules)")
    assert (
        "r.sql:1:58: cannot import Python aggregate 'this:Zen': module 'this' is refused: it is "
        f"outside the rule folders ({rules}) and not in [rules] python_modules of lookout.toml; "
        'to allow it, add "this" there (or to LOOKOUT_RULES_PYTHON_MODULES)'
    ) in out
    assert "Beautiful is better than ugly" not in out
    assert out.splitlines()[-1] == "imported: False"


@pytest.mark.parametrize("target", ["os:PathLike", "sys:X", "json.decoder:JSONDecoder"])
def test_standard_modules_are_refused_too(tmp_path: Path, target: str) -> None:
    (tmp_path / "r.sql").write_text(AGGREGATE.format(target=target))
    (error,) = check_paths([tmp_path / "r.sql"])
    assert "is refused: it is outside the rule folders" in error.message


def test_the_library_module_is_inside_its_folder_or_allowed(tmp_path: Path) -> None:
    silence = (
        "CREATE AGGREGATE silence(ts TIMESTAMP) RETURNS TIMESTAMP LANGUAGE PYTHON "
        "AS 'rules.udas:Silence';\n"
    )
    (tmp_path / "r.sql").write_text(silence)
    nothing_allowed = RulePolicy(python_modules=())
    # rules/udas.py is in the library's own folder: allowed without a word in lookout.toml.
    load_rules([RULES_DIR], nothing_allowed)
    # A copy of a rule elsewhere reaches it through the allow-list only.
    assert check_paths([tmp_path / "r.sql"]) == []
    (error,) = check_paths([tmp_path / "r.sql"], nothing_allowed)
    assert "module 'rules.udas' is refused" in error.message
