"""A small disk of a test's own, to fill up or make read-only: a tmpfs mounted under the
test's folder. Mounting needs root (and a kernel that lets it mount): elsewhere the test
is skipped, saying so."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_disk(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (`2m`, `16m`) mounted at `folder` (made if missing) for the
    `with` block, unmounted after it whatever happens; skips the test where it cannot be
    mounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(folder)], check=True)


def remount(disk: Path, mode: str, patience: float = 30.0) -> None:
    """Remount `disk` read-only (`ro`) or writable (`rw`). The kernel refuses `ro` while
    any file on it is open for writing (a process writing its health file, say), so a
    busy disk is tried again for up to `patience` seconds."""
    deadline = time.monotonic() + patience
    while True:
        done = subprocess.run(
            ["mount", "-o", f"remount,{mode}", str(disk)], capture_output=True, text=True
        )
        if done.returncode == 0:
            return
        if "busy" not in done.stderr or time.monotonic() > deadline:
            raise AssertionError(
                f"mount -o remount,{mode} {disk}: {done.stderr.strip()}\n"
                f"files open on it: {open_files(disk) or 'none'}"
            )
        time.sleep(0.02)


def open_files(disk: Path) -> list[str]:
    """Every file a process holds open on `disk`, as `pid command: path (flags)`: what
    keeps a remount busy (a file open for writing, or deleted while still open)."""
    found = []
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            target = os.readlink(fd)
            info = (fd.parent.parent / "fdinfo" / fd.name).read_text()
            flags = re.search(r"^flags:\s*(\d+)", info, re.MULTILINE)
            command = (fd.parent.parent / "comm").read_text().strip()
        except OSError:
            continue
        if target.startswith(f"{disk}/"):
            found.append(
                f"{fd.parent.parent.name} {command}: {target} (flags {flags and flags[1]})"
            )
    return found


def fill(disk: Path, name: str = "filler") -> Path:
    """Write a file until the disk has no space left; returns it (delete it to free)."""
    filler = disk / name
    with open(filler, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError as err:
            assert err.errno == errno.ENOSPC, err
    return filler
