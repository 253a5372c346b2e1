"""CPU and memory of the processes in a benchmark: the frontend (JVM), the workers, the generator,
and the CPU everything else on the machine used meanwhile (a shared machine's noise, measured).

CPU% is CPU time over wall time between two readings, in percent of one core (200% = both cores
of this machine busy). RSS is the resident memory at the later reading, summed over a group.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import psutil

GENERATOR = "generator"
FRONTEND = "frontend"
WORKERS = "workers"
OTHERS = "others"  # every other process on the machine
_MACHINE = "machine"
# Other processes using more than this (% of one core) during a point make it noisy.
NOISY_OTHERS_PCT = 15.0


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
        self._groups: dict[str, tuple[psutil.Process, ...]] = {}
        for name, pids in groups.items():
            procs = []
            for pid in pids:
                with contextlib.suppress(psutil.Error):
                    procs.append(psutil.Process(pid))
            self._groups[name] = tuple(procs)

    @classmethod
    def for_server(cls, java_pid: int | None, worker_pids: Sequence[int]) -> ProcessGroups:
        return cls({GENERATOR: [os.getpid()], FRONTEND: [java_pid] if java_pid else [], WORKERS: list(worker_pids)})

    def read(self) -> Reading:
        cpu: dict[str, float] = {}
        rss: dict[str, int] = {}
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


def usage(before: Reading, after: Reading) -> dict[str, Usage]:
    wall = after.at - before.at
    if wall <= 0:
        raise ValueError("readings out of order")
    cpu = {name: 100.0 * max(0.0, after.cpu_s[name] - before.cpu_s.get(name, 0.0)) / wall for name in after.cpu_s}
    machine = cpu.pop(_MACHINE, None)
    out = {name: Usage(pct, after.rss_bytes[name] / 2**20) for name, pct in cpu.items()}
    if machine is not None:
        out[OTHERS] = Usage(max(0.0, machine - sum(cpu.values())), 0.0)
    return out


# -- the machine as a whole --------------------------------------------------------------------
def torchserve_pids() -> list:
    """Every TorchServe frontend (JVM) on the machine."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error, TypeError):
            if any("org.pytorch.serve" in part for part in proc.info["cmdline"] or ()):
                found.append(proc.info["pid"])
    return found


def machine_conditions() -> dict:
    return {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "load_average": [round(x, 2) for x in os.getloadavg()],
            "other_torchserve_pids": torchserve_pids()}


def wait_for_quiet(max_wait_s: float, progress: Callable[[str], None], ours: Sequence[int] = (),
                   busy_pct: float = 20.0) -> dict:
    """Wait (at most max_wait_s) until no other TorchServe runs and the machine's CPU use over 2 s
    is below busy_pct (of the whole machine). `ours`: our own idle server's JVM, not counted.
    Returns the machine's conditions then, and how the wait went."""
    began = time.monotonic()
    announced = False
    while True:
        others = [pid for pid in torchserve_pids() if pid not in ours]
        cpu = psutil.cpu_percent(interval=2.0)
        quiet = not others and cpu < busy_pct
        waited = time.monotonic() - began
        if quiet or waited >= max_wait_s:
            if announced:
                progress(f"waited {waited:.0f} s: {'quiet' if quiet else 'still busy, going on'} "
                         f"(CPU {cpu:.0f}%, other TorchServe {others or 'none'})")
            return {**machine_conditions(), "quiet": quiet, "waited_s": round(waited, 1), "cpu_pct": cpu,
                    "other_torchserve_pids": others}
        if not announced:
            progress(f"waiting for a quiet machine (CPU {cpu:.0f}%, other TorchServe {others or 'none'}), "
                     f"at most {max_wait_s:.0f} s")
            announced = True
        time.sleep(5.0)
