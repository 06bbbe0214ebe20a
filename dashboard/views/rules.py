"""Rules: every rule with its text, explanation and alert count, and an editor that checks
a rule file like `lookout rules check` and saves it into the rules folder when valid."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard.data import query, rules_dir, table_version
from dashboard.rule_folder import book_of
from dashboard.rulebook import NAME, Book, annotate, check_file, save_file
from dashboard.ui import panel
from rules.language.errors import RuleError

NEW = "(new file)"


def alert_counts() -> dict[str, int]:
    """Alerts written so far per rule."""
    if table_version("alerts") is None:
        return {}
    counts = query("SELECT rule, count(*) AS n FROM alerts GROUP BY rule", "alerts")
    return {} if counts is None else dict(zip(counts["rule"], counts["n"], strict=True))


@panel
def rule_list(book: Book) -> None:
    """A table of every statement, then the chosen one's text and explanation."""
    if not book.rules:
        st.info(f"No rules in `{rules_dir()}` yet. Write one below and save it.")
        return
    counts = alert_counts()
    summary = pd.DataFrame(
        [
            {
                "rule": r.name,
                "kind": r.kind,
                "severity": r.severity or "",
                "alerts": counts.get(r.name, 0) if r.kind == "alert" else None,
                "file": f"{r.file}:{r.line}",
            }
            for r in book.rules
        ]
    )
    st.dataframe(summary, hide_index=True, width="stretch")
    # One rule at a time: drawing every rule's text and explanation made the page slow.
    alerts = [r.name for r in book.rules if r.kind == "alert"]
    names = [r.name for r in book.rules]
    chosen = st.selectbox(
        "Show rule", names, key="rule_shown", index=names.index(alerts[0]) if alerts else 0
    )
    rule = next(r for r in book.rules if r.name == chosen)
    heading = f"{rule.kind} **{rule.name}** ({rule.file}:{rule.line})"
    if rule.kind == "alert":
        heading += f" — {counts.get(rule.name, 0):,} alerts"
    st.markdown(heading)
    left, right = st.columns(2)
    left.code(rule.text, language="sql", wrap_lines=True)
    right.code(rule.explanation or "(no explanation)", language=None, wrap_lines=True)


def _show_errors(name: str, text: str, errors: list[RuleError]) -> None:
    """The errors in the edited file inline under their lines, then any others."""
    st.error(
        f"{len(errors)} error{'s' if len(errors) != 1 else ''}: fix them before saving "
        "(nothing was saved)."
    )
    here = [e for e in errors if e.file == f"{name}.sql"]
    elsewhere = [e for e in errors if e.file != f"{name}.sql"]
    if here:
        st.code(annotate(text, here), language=None, wrap_lines=True)
    for error in elsewhere:
        st.code(error.format(), language=None)


@panel
def editor(book: Book) -> None:
    """Pick a file (or a new one), edit it, check it, save it."""
    folder = rules_dir()
    files = sorted({r.file for r in book.rules} | {p.name for p in folder.glob("*.sql")})
    choice = st.selectbox("File", [NEW, *files], key="rule_file")
    current = "" if choice == NEW else (folder / choice).read_text(encoding="utf-8")
    default_name = "" if choice == NEW else choice.removesuffix(".sql")
    name = st.text_input(
        "File name (saved as `<name>.sql`)",
        value=default_name,
        key=f"rule_name::{choice}",
        placeholder="e.g. my_rules",
    )
    text = st.text_area(
        "Rule text",
        value=current,
        height=200,
        key=f"rule_text::{choice}",
        placeholder="CREATE ALERT ... AS SELECT ... FROM traffic WHERE ...",
    )
    check, save = st.columns([1, 6])
    checked = check.button("Check", key="rule_check")
    saved = save.button("Save", type="primary", key="rule_save")
    if not (checked or saved):
        return
    if not NAME.match(name):
        st.error("The file name must be letters, digits and underscores (no folders, no `.sql`).")
        return
    errors = save_file(folder, name, text) if saved else check_file(folder, name, text)
    if errors:
        _show_errors(name, text, errors)
    elif saved:
        st.success(
            f"Saved `{folder / (name + '.sql')}`. The engine uses it from its next "
            "start (`lookout engine`)."
        )
    else:
        st.success("No errors.")


def main() -> None:
    """The page: the rules in the folder, then the editor."""
    folder = rules_dir()
    st.caption(f"Rule folder: `{folder}`")
    book = book_of(folder)
    if book.errors:
        st.warning(
            f"The rule folder has {len(book.errors)} error(s); the engine will refuse "
            "to start until they are fixed:"
        )
        st.code("\n".join(e.format() for e in book.errors), language=None)
    rule_list(book)
    st.subheader("Write or edit a rule file")
    editor(book)


panel(main)()
