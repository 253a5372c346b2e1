"""CPU and memory of the processes in a benchmark: the frontend (JVM), the workers, the generator,
and the CPU everything else on the machine used meanwhile (a shared machine's noise, measured).

CPU% is CPU time over wall time between two readings, in percent of one core (200% = both cores
of this machine busy). RSS is the resident memory at the later reading, summed over a group.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from types import MappingProxyType
from typing import Dict, Mapping, Sequence, Tuple

import psutil

GENERATOR = "generator"
FRONTEND = "frontend"
WORKERS = "workers"
OTHERS = "others"  # every other process on the machine
_MACHINE = "machine"


@dataclass(frozen=True)
class Reading:
    """CPU seconds and RSS bytes per group at one moment."""

    at: float
    cpu_s: Mapping[str, float]
    rss_bytes: Mapping[str, int]


@dataclass(frozen=True)
class Usage:
    cpu_pct: float
    rss_mb: float

    def to_json(self) -> dict:
        return {"cpu_pct": round(self.cpu_pct, 1), "rss_mb": round(self.rss_mb, 1)}


class ProcessGroups:
    """Named groups of processes, read together. Processes that vanished count as zero."""

    def __init__(self, groups: Mapping[str, Sequence[int]]) -> None:
        self._groups: Dict[str, Tuple[psutil.Process, ...]] = {}
        for name, pids in groups.items():
            procs = []
            for pid in pids:
                with contextlib.suppress(psutil.Error):
                    procs.append(psutil.Process(pid))
            self._groups[name] = tuple(procs)

    @classmethod
    def for_server(cls, java_pid: int | None, worker_pids: Sequence[int]) -> "ProcessGroups":
        return cls({GENERATOR: [os.getpid()], FRONTEND: [java_pid] if java_pid else [], WORKERS: list(worker_pids)})

    def read(self) -> Reading:
        cpu: Dict[str, float] = {}
        rss: Dict[str, int] = {}
        for name, procs in self._groups.items():
            cpu[name], rss[name] = 0.0, 0
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    with proc.oneshot():
                        times = proc.cpu_times()
                        cpu[name] += times.user + times.system
                        rss[name] += proc.memory_info().rss
        total = psutil.cpu_times()
        cpu[_MACHINE] = total.user + total.nice + total.system + getattr(total, "irq", 0.0) + \
            getattr(total, "softirq", 0.0) + getattr(total, "steal", 0.0)
        rss[_MACHINE] = 0
        return Reading(time.perf_counter(), MappingProxyType(cpu), MappingProxyType(rss))


def usage(before: Reading, after: Reading) -> Dict[str, Usage]:
    wall = after.at - before.at
    if wall <= 0:
        raise ValueError("readings out of order")
    cpu = {name: 100.0 * max(0.0, after.cpu_s[name] - before.cpu_s.get(name, 0.0)) / wall for name in after.cpu_s}
    machine = cpu.pop(_MACHINE, None)
    out = {name: Usage(pct, after.rss_bytes[name] / 2**20) for name, pct in cpu.items()}
    if machine is not None:
        out[OTHERS] = Usage(max(0.0, machine - sum(cpu.values())), 0.0)
    return out
