"""The landing source's offsets read every landed file exactly once, through crashes.

A model of Spark's micro-batch protocol as `MicroBatchExecution` runs it drives the pure
offset functions: a batch's end offset is written to the offset log before the batch
runs; the previous batch's offset is committed to the source (its files removed) just
before a batch runs; a batch counts once its id is in the commit log; after a crash the
last logged batch, if it has no commit, runs again from the logged offsets. Hypothesis
lands files (in any name order) and crashes the engine between any two of those steps,
including halfway through removing a batch's files; each batch admits at most `max_new`
new files.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.landing_offsets import batch_files, committed_files, initial_offset, next_offset
from tests.examples import examples

# Where a step may stop: after logging its offset, after removing `removed` of the
# previous batch's files, or after reading its files but before the commit log.
CRASH_POINTS = ["none", "after_offset_log", "mid_removal", "before_commit_log"]


@dataclass
class Engine:
    """The landing folder, Spark's offset and commit logs, and what each batch read."""

    max_new: int
    folder: set[str] = field(default_factory=set)
    offset_log: list[dict] = field(default_factory=list)
    # Per planned batch: the new files it admitted, and the new ones it left for later.
    admissions: list[tuple[list[str], list[str]]] = field(default_factory=list)
    commit_log: set[int] = field(default_factory=set)
    reads: dict[int, list[str]] = field(default_factory=dict)  # the first run of each batch

    def offset(self, batch: int) -> dict:
        return self.offset_log[batch] if batch >= 0 else initial_offset()

    def run(self, batch: int) -> None:
        files = batch_files(self.offset(batch - 1), self.offset(batch))
        missing = set(files) - self.folder
        assert not missing, f"batch {batch} cannot read removed files {missing}"
        assert self.reads.setdefault(batch, files) == files, "a re-run read other files"

    def commit_source(self, batch: int, removed: int | None = None) -> None:
        self.folder -= set(committed_files(self.offset(batch))[:removed])

    def restart(self) -> None:
        """Spark's recovery: re-run the last logged batch if it was not committed."""
        last = len(self.offset_log) - 1
        if last >= 0 and last not in self.commit_log:
            self.run(last)
            self.commit_log.add(last)

    def step(self, crash: str, removed: int) -> bool:
        """One trigger: plan the next batch (if any file is new), then run it. Returns
        whether a batch was planned."""
        last = len(self.offset_log) - 1
        start = self.offset(last)
        end = next_offset(start, self.folder, self.max_new)
        if end == start:
            return False
        self.offset_log.append(dict(end))
        new = self.folder - set(start["files"])
        admitted = sorted(set(end["files"]) - set(start["files"]))
        self.admissions.append((admitted, sorted(new - set(admitted))))
        batch = last + 1
        if crash == "after_offset_log":
            self.restart()
        elif crash == "mid_removal":
            self.commit_source(batch - 1, removed)
            self.restart()
        else:
            self.commit_source(batch - 1)
            self.run(batch)
            if crash == "before_commit_log":
                self.restart()
            else:
                self.commit_log.add(batch)
        return True


landings = st.lists(
    st.tuples(st.sampled_from(["traffic", "positions"]), st.integers(0, 999)), max_size=4
)
steps = st.lists(st.tuples(landings, st.sampled_from(CRASH_POINTS), st.integers(0, 5)), max_size=25)
bounds = st.integers(1, 6)


def name(stream: str, time: int, count: int) -> str:
    """A landing file as ingest names it: the landing time first, in its stream's folder."""
    return f"stream={stream}/part-{time:04d}-{count}.jsonl"


def landing_order(path: str) -> tuple[str, str]:
    return path.rsplit("/", 1)[1], path


def run_script(script: list, max_new: int, crashes: bool = True) -> tuple[Engine, list[str]]:
    """Land each step's files (unique names, in no particular order), then trigger, with
    the step's crash if `crashes`. Returns the engine and the files landed."""
    engine = Engine(max_new)
    landed: list[str] = []
    for names, crash, removed in script:
        for stream, time in names:
            landed.append(name(stream, time, len(landed)))
            engine.folder.add(landed[-1])
        engine.step(*((crash, removed) if crashes else ("none", 0)))
    return engine, landed


@settings(max_examples=examples(300), deadline=None)
@given(steps, bounds)
def test_every_landed_file_is_read_by_exactly_one_batch(script, max_new: int) -> None:
    engine, landed = run_script(script, max_new)
    while engine.step("none", 0):  # clean triggers read whatever is left
        pass

    read = [f for batch in sorted(engine.commit_log) for f in engine.reads[batch]]
    assert sorted(read) == sorted(landed), "every file read once, none lost or twice"
    assert set(engine.reads) == engine.commit_log


@settings(max_examples=examples(300), deadline=None)
@given(steps, bounds)
def test_a_batch_admits_at_most_the_bound_and_the_oldest_first(script, max_new: int) -> None:
    """However big the backlog, a batch admits at most `max_new` new files, and none it
    leaves for later landed before one it admits (so each stream's files are judged in
    the order they landed, batch after batch)."""
    engine, landed = run_script(script, max_new)
    assert engine.admissions or not landed
    for admitted, left in engine.admissions:
        assert 1 <= len(admitted) <= max_new
        if left:
            assert max(map(landing_order, admitted)) < min(map(landing_order, left))


@settings(max_examples=examples(200), deadline=None)
@given(steps, bounds)
def test_offsets_name_only_the_backlog(script, max_new: int) -> None:
    """Committed files leave the folder and the offsets: once a later batch has started,
    an offset names only the files of the batch before and its own."""
    engine, _ = run_script(script, max_new, crashes=False)
    for batch in range(1, len(engine.offset_log)):
        named = set(engine.offset_log[batch]["files"])
        recent = set(batch_files(engine.offset(batch - 2), engine.offset(batch)))
        assert named <= recent
