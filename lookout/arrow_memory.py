"""Arrow's memory pool in `lookout replay`: the C library's allocator.

pyarrow's default pool, mimalloc, reserves its memory in 1 GiB arenas marked for
transparent huge pages and hands freed pages back to the kernel soon after; using them
again faults in fresh 2 MiB pages the kernel must zero first. On a 2-core VM, replaying
1.2 million readings spent a quarter of its time zeroing such pages and took 17-25 s;
with glibc's malloc it took 8.5-11.7 s, with the same outputs. The engine keeps Arrow's
default: its batches are small, and with glibc's malloc its CPU per reading was no lower
and its Python workers' memory grew more. An operator may still choose a pool with
Arrow's own ``ARROW_DEFAULT_MEMORY_POOL``.
"""

from __future__ import annotations

import os

POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"
"""Arrow reads it when a process first allocates; child processes inherit it."""


def use_system_allocator() -> None:
    """Make glibc's malloc Arrow's pool here and in every child process started from now
    on, unless ``ARROW_DEFAULT_MEMORY_POOL`` already names one."""
    if os.environ.setdefault(POOL_VARIABLE, "system") == "system":
        import pyarrow as pa

        # This process may have allocated already, so its pool is set, not just named.
        pa.set_memory_pool(pa.system_memory_pool())
