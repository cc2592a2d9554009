"""Whether this process is a fork() child that inherited an OpenMP runtime already in
use: read once, when fastpe is first imported, before its kernels load.

fastpe's own fork hook (fastpe._threads) runs only where fastpe was imported before the
fork. A child that imports fastpe for the first time after its parent ran a parallel
region in the same GNU OpenMP runtime (torch ships libgomp.so.1, which the kernels then
share) holds a dead copy of that runtime's thread pool: its first parallel region waits
forever. Such a child maps the runtime at the address where its parent maps it (fork
copies the address space; a program started with exec gets its own layout), so an
OpenMP runtime already mapped here and mapped at the same address in the parent
process marks one. The answer errs towards one thread: a child whose parent loaded
the runtime but never started a team also runs serially, and so would a process whose
parent shares its layout because address randomisation is off.
"""

from __future__ import annotations

import os

_RUNTIMES = ("libgomp", "libomp", "libiomp")


def _runtime_mappings(pid: int | str) -> set[str]:
    """'start-end path' of each OpenMP runtime mapping of process `pid` (Linux)."""
    found = set()
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split(None, 5)
            if len(fields) == 6 and any(r in fields[5] for r in _RUNTIMES):
                found.add(f"{fields[0]} {fields[5].strip()}")
    return found


def _inherited_runtime() -> bool:
    try:
        mine = _runtime_mappings("self")
        return bool(mine) and not mine.isdisjoint(_runtime_mappings(os.getppid()))
    except (OSError, ValueError):   # no /proc (macOS, Windows), or the parent is gone
        return False


INHERITED_RUNTIME = _inherited_runtime()
