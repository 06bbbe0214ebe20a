"""Rules: every rule with its text, explanation and alert count; an editor that checks a
rule file with the rest of the rule set like `lookout rules check`, previews what its
alerts would have raised on the stored readings like `lookout rules preview`, and saves
it into the user rule store when valid; renaming, disabling and deleting the user's
files; who changed what."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard.charts import channel, chart, tip
from dashboard.data import DataError, health, lakehouse, query, storage, table_version
from dashboard.login import current_user
from dashboard.rule_folder import book_of
from dashboard.rulebook import Book, annotate
from dashboard.settings import config, rule_store
from dashboard.ui import panel
from engine.alerts import iso_utc
from lookout.health import engine_running
from lookout.preview import Preview, PreviewError, preview
from lookout.rule_status import file_statuses
from rules.language.errors import RuleError, named_by_file
from rules.language.loader import RuleCheckError
from rules.store import RuleNameError, RuleStore

NEW = "(new file)"
HISTORY = {"last 15 minutes": 15, "last hour": 60, "last 6 hours": 360, "last 24 hours": 1440}
"""How much stored history the Preview button evaluates, in minutes back from the
stored watermark."""


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
        st.info("No rules yet. Write one below and save it.")
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


def _show_errors(
    name: str, text: str, errors: list[RuleError], outcome: str = "nothing was saved"
) -> None:
    """The errors in the edited file inline under their lines, then any others."""
    st.error(
        f"{len(errors)} error{'s' if len(errors) != 1 else ''}: fix them before saving ({outcome})."
    )
    here = [e for e in errors if e.file == f"{name}.sql"]
    elsewhere = [e for e in errors if e.file != f"{name}.sql"]
    if here:
        st.code(annotate(text, here), language=None, wrap_lines=True)
    for error in elsewhere:
        st.code(error.format(), language=None)


@panel
def editor(store: RuleStore) -> None:
    """Pick one of the user's rule files (or a new one), edit it, check it, save it."""
    choice = st.selectbox("File", [NEW, *(f"{n}.sql" for n in store.names())], key="rule_file")
    default_name = "" if choice == NEW else choice.removesuffix(".sql")
    current = "" if choice == NEW else store.text(default_name)
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
    check, look, span, save = st.columns([1, 1, 2, 3], vertical_alignment="bottom")
    checked = check.button("Check", key="rule_check")
    previewed = look.button("Preview", key="rule_preview")
    history = span.selectbox("Preview over", list(HISTORY), index=1, key="rule_preview_span")
    saved = save.button("Save", type="primary", key="rule_save")
    if previewed:
        _preview(store, name, text, HISTORY[history])
        return
    if not (checked or saved):
        return
    try:
        errors = store.save(name, text, current_user()) if saved else store.check(name, text)
    except RuleNameError as exc:
        st.error(str(exc))
        return
    if errors:
        _show_errors(name, text, errors)
    elif saved:
        st.success(
            f"Saved `{store.folder / (name + '.sql')}`. A running engine applies it within "
            "seconds (see *Running in the engine*), its windows filled from the stored "
            "readings."
        )
    else:
        st.success("No errors.")


def _preview(store: RuleStore, name: str, text: str, minutes: int) -> None:
    """Evaluate the edited text's alerts over the stored readings (after the same
    checks as saving, the sandbox among them) and show what they would have raised."""
    try:
        with st.spinner("Evaluating the rules over the stored readings…"):
            result = preview(
                store.rule_paths(),
                store.path(name),
                text,
                lakehouse(),
                minutes * 60_000,
                store.policy,
                storage(),
            )
    except RuleNameError as exc:
        st.error(str(exc))
        return
    except RuleCheckError as exc:
        _show_errors(name, text, named_by_file(exc.errors), "nothing was evaluated")
        return
    except (PreviewError, DataError) as exc:
        st.warning(str(exc))
        return
    _show_preview(result)


def _show_preview(result: Preview) -> None:
    """Per rule and key the alerts and incidents, a chart of alerts per minute, the
    incidents, and the time taken."""
    read = ", ".join(f"{s.readings:,} {s.stream} readings" for s in result.streams)
    st.success(
        f"Preview from {iso_utc(result.start)} to {iso_utc(result.end)} (the stored "
        f"watermark): {read}; evaluated in {result.evaluate_s:.2f} s (reading "
        f"{result.read_s:.2f} s). Nothing was saved."
    )
    st.dataframe(pd.DataFrame(result.summary()), hide_index=True, width="stretch")
    alerts = pd.DataFrame(
        [{"rule": a.rule, "key": a.key or "-", "ts": a.ts} for a in result.alerts],
        columns=["rule", "key", "ts"],
    )
    alerts["minute"] = pd.to_datetime(alerts["ts"] // 60_000 * 60_000, unit="ms", utc=True)
    per_minute = alerts.groupby(["rule", "key", "minute"]).size().reset_index(name="alerts")
    for rule in result.rules:
        rows = per_minute[per_minute["rule"] == rule]
        if rows.empty:
            st.caption(f"{rule}: no alert in this history.")
            continue
        spec = chart(
            "bar",
            channel("minute", "temporal", "minute (UTC)"),
            channel("alerts", "quantitative", f"{rule} alerts"),
            channel("key", "nominal"),
            [tip("minute", "temporal"), tip("key", "nominal"), tip("alerts", "quantitative")],
        )
        st.vega_lite_chart(rows, spec, width="stretch")
    if result.incidents:
        incidents = pd.DataFrame(result.incidents)
        for column in ("opened_at", "last_report_at", "resolved_at"):
            incidents[column] = pd.to_datetime(incidents[column], unit="ms", utc=True)
        shown_columns = ["rule", "key", "opened_at", "resolved_at", "reports", "message"]
        st.dataframe(incidents[shown_columns], hide_index=True, width="stretch")


def _file_name(choice: str) -> str:
    """`crawl` of the chooser's `crawl.sql` or `crawl.sql (disabled)`."""
    return choice.removesuffix(" (disabled)").removesuffix(".sql")


def _change(action: str) -> None:
    # A button's callback: it runs before the page is drawn again, so the page then
    # shows the files as the change left them.
    name = _file_name(st.session_state["manage_file"])
    new = st.session_state.get("manage_new_name", "")
    user = current_user()
    try:
        store = rule_store()
        done, errors = {
            "rename": lambda: (f"Renamed to `{new}.sql`.", store.rename(name, new, user)),
            "disable": lambda: (f"`{name}.sql` is no longer loaded.", store.disable(name, user)),
            "enable": lambda: (f"`{name}.sql` is loaded again.", store.enable(name, user)),
            "delete": lambda: (f"Deleted `{name}`.", store.delete(name, user)),
        }[action]()
    except (RuleNameError, DataError) as exc:
        st.session_state["manage_outcome"] = (str(exc), None)
        return
    st.session_state["manage_outcome"] = (done, errors)
    st.session_state["manage_sure"] = False  # each deletion asks again


def _show_outcome() -> None:
    """What the last change did, or why it was refused."""
    message, errors = st.session_state.pop("manage_outcome", ("", []))
    if errors is None:
        st.error(message)
    elif errors:
        st.error(f"Refused: the rules would have {len(errors)} error(s); nothing was changed:")
        st.code("\n".join(e.format() for e in errors), language=None)
    elif message:
        st.success(message)


@panel
def manage(store: RuleStore) -> None:
    """Rename, disable, enable or delete one of the user's rule files."""
    _show_outcome()
    enabled, disabled = store.names(), store.disabled()
    files = [*(f"{n}.sql" for n in enabled), *(f"{n}.sql (disabled)" for n in disabled)]
    if not files:
        st.caption("No rule files of yours yet.")
        return
    name = _file_name(st.selectbox("Rule file", files, key="manage_file"))
    left, middle, right = st.columns(3)
    left.text_input("New name", key="manage_new_name", placeholder="e.g. my_alerts")
    left.button(
        "Rename", key="manage_rename", disabled=name in disabled, on_click=_change, args=("rename",)
    )
    if name in disabled:
        middle.button("Enable", key="manage_enable", on_click=_change, args=("enable",))
    else:
        middle.button("Disable", key="manage_disable", on_click=_change, args=("disable",))
    sure = right.checkbox("Yes, delete it", key="manage_sure")
    right.button(
        "Delete", key="manage_delete", disabled=not sure, on_click=_change, args=("delete",)
    )


@panel
def changes(store: RuleStore) -> None:
    """Who changed which rule file, and when."""
    log = store.changes()
    if not log:
        st.caption("No change made here yet.")
        return
    st.dataframe(pd.DataFrame(log), hide_index=True, width="stretch")


def running() -> None:
    """Which version of each rule file the engine runs (it applies a saved change within
    a few seconds, without a restart), and the last change it refused."""
    record = health("engine")
    up = record is not None and engine_running(record, 0)
    rows = file_statuses(config(), record if up else None)
    if not up:
        st.caption("No engine is running: saved rules run when it starts.")
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "file": f.file,
                    "on disk": f.on_disk,
                    "running": f.running or "-",
                    "state": f.state,
                }
                for f in rows
            ]
        ),
        hide_index=True,
        width="stretch",
    )
    rejected = ((record or {}).get("rules") or {}).get("rejected") if up else None
    if rejected:
        st.error(
            "The engine refused the latest change of the rule files and runs the last good rules:"
        )
        st.code("\n".join(rejected["errors"]), language=None)


def main() -> None:
    """The page: every rule of the rule set, then the editor of the user's rule files,
    their management and the changes made to them."""
    store = rule_store()
    library = ", ".join(f"`{folder}`" for folder in store.library)
    st.caption(f"Rule library (read-only here): {library}. Your rule files: `{store.folder}`.")
    book = book_of(store)
    if book.errors:
        st.warning(
            f"The rules have {len(book.errors)} error(s); the engine keeps running the "
            "last good rules until they are fixed:"
        )
        st.code("\n".join(e.format() for e in book.errors), language=None)
    rule_list(book)
    st.subheader("Running in the engine")
    running()
    st.subheader("Write or edit a rule file")
    editor(store)
    st.subheader("Your rule files")
    manage(store)
    st.subheader("Changes")
    changes(store)


panel(main)()
