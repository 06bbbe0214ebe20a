"""Keep Spark's start-up chatter out of the engine's log.

Spark's JVM and the Python workers it starts write to the engine process's own stdout
and stderr, outside Python's logging: at every start Ivy's report on the Delta
packages (about 80 lines), log4j's greeting, and at every query start PySpark's
transformWithState worker banners (five multi-line prints). None of it says anything
an operator can act on, and it buries the engine's own lines. :func:`filter_output`
puts a pipe in front of the process's stdout and stderr that drops exactly those lines
(:func:`is_noise`) and passes everything else through unchanged: warnings, errors,
stack traces and the engine's log.
"""

from __future__ import annotations

import atexit
import os
import re
import sys
import threading

_NOISE = re.compile(
    "|".join(
        (
            # Ivy resolving spark.jars.packages (Delta, hadoop-aws)
            r":: (loading settings|resolving dependencies|resolution report|retrieving)\b",
            r"\t:: (modules in use|evicted modules):$",
            r"Ivy Default Cache set to: ",
            r"The jars for the packages stored in: ",
            r"\S+#\S+ added as a dependency$",
            r"\tconfs: \[default\]$",
            r"\tfound \S+#\S+;\S+ in \S+$",
            r"\t\S+#\S+;\S+ (from \S+ in|by \[.*\] in) \[default\]$",
            r"\t\d+ artifacts copied, \d+ already retrieved",
            r"\t[-|]",
            # the JVM's and log4j's greetings
            r"WARNING: Using incubator modules: ",
            r"Using Spark's default log4j profile: ",
            r'Setting default log level to "WARN"\.$',
            r"To adjust logging level use sc\.setLogLevel\(newLevel\)\.",
            r"\S+ \S+ WARN NativeCodeLoader: Unable to load native-hadoop library",
            # PySpark's transformWithState driver worker, at each query start
            r"(Starting )?Streaming TransformWithStateInPandas Python worker\b",
        )
    )
)


def is_noise(line: str) -> bool:
    """Whether `line` (without its newline) is start-up chatter the engine drops."""
    return _NOISE.match(line) is not None


class LineFilter:
    """Drops noise lines from a stream of text chunks, and the empty lines that follow
    a dropped line (PySpark's banners end in a blank line); a partial last line waits
    for its end."""

    def __init__(self) -> None:
        self._pending = ""
        self._dropped = False

    def feed(self, text: str) -> str:
        """The part of `text` (and of what came before) to pass on."""
        lines = (self._pending + text).split("\n")
        self._pending = lines.pop()
        kept = []
        for line in lines:
            if is_noise(line) or (self._dropped and not line.strip()):
                self._dropped = True
                continue
            self._dropped = False
            kept.append(line + "\n")
        return "".join(kept)


def filter_output() -> None:
    """From now on, route this process's stdout and stderr (and so those of the JVM and
    the workers it starts later) through a :class:`LineFilter` each. At exit the
    process's own descriptors are put back and what is still in the pipes is passed
    on (a last error message included)."""
    pumps = []
    for fd in (1, 2):
        read_end, write_end = os.pipe()
        target = os.dup(fd)
        os.dup2(write_end, fd)
        os.close(write_end)
        pump = threading.Thread(
            target=_pump, args=(read_end, target), name=f"output-filter-{fd}", daemon=True
        )
        pump.start()
        pumps.append((fd, target, pump))

    def restore() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, target, pump in pumps:
            os.dup2(target, fd)  # the pipe's last writer here: its pump reaches the end
            pump.join(timeout=2)  # unless the JVM still holds it

    atexit.register(restore)


def _pump(read_end: int, target: int) -> None:
    """Copy what is written to `read_end` to `target`, filtered, until the last writer
    closes it. A failure of the filter passes the rest through as it comes: a full pipe
    would stop every writer."""
    lines = LineFilter()
    while chunk := os.read(read_end, 65536):
        try:
            out = lines.feed(chunk.decode("utf-8", "replace")).encode()
        except Exception:  # never block the writers
            out = chunk
        while out:
            out = out[os.write(target, out) :]
