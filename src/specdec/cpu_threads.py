"""How many CPU threads torch uses: chosen for the machine's real load, not its core count.

torch starts with one intra-op thread per physical core. On a machine that is also running
other work, those threads contend with it and with each other: on a 2-core box at load
average 3-6, SmolLM2 decoding ran at 0.7-1.7 tok/s with torch's default threads and at
17-22 tok/s with one. `threads="auto"` (the `SpecConfig` default, `--threads` on the command
line) therefore lowers torch's count to the cores not already busy, from the 1-minute load
average, and never raises it (so a count the user or a test set lower stays); an int sets
it exactly. CUDA decoding is unaffected (its host work is one thread).
"""

from __future__ import annotations

import os

__all__ = ["apply_threads", "auto_threads", "usable_cpus"]


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which containers narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def auto_threads(current: int, cpus: int | None = None, load: float | None = None) -> int:
    """At most `current` threads, at most the usable CPUs not busy with other work, at least 1.

    Args:
        current: torch's thread count now (the upper bound: "auto" never raises it).
        cpus: usable CPUs (default: `usable_cpus()`).
        load: the 1-minute load average (default: `os.getloadavg()[0]`; 0 where unknown).
    """
    cpus = usable_cpus() if cpus is None else cpus
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (OSError, AttributeError):  # no load average on this platform
            load = 0.0
    idle = int(cpus - load + 0.5)  # cores left once the running work has its share
    return max(1, min(current, cpus, idle))


def apply_threads(threads: int | str) -> int:
    """Set torch's intra-op thread count from a `SpecConfig.execution.threads` value; returns it."""
    import torch

    count = auto_threads(torch.get_num_threads()) if threads == "auto" else int(threads)
    if count != torch.get_num_threads():
        torch.set_num_threads(count)
    return count
