"""When an open-loop client sends: arrival schedules as increasing offsets (s) from its start."""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator

from serving.errors import BenchmarkError


def poisson_schedule(rate: float, seed: int = 0) -> Iterator[float]:
    """Arrival offsets (s) of a Poisson process: independent clients, together `rate` req/s."""
    rng = random.Random(seed)
    offset = 0.0
    while True:
        offset += rng.expovariate(rate)
        yield offset


def per_connection_schedule(rate: float, connections: int, threads: int, stagger_s: float = 0.005) -> Iterator[float]:
    """Arrival offsets (s) of a constant-rate client that paces each connection on its own, as wrk2
    does: every connection sends every `connections / rate` s, and a thread's connections start
    `stagger_s` apart (threads start together). At a low rate over many connections the requests
    come in bursts: all connections' turns fall within (connections / threads) x stagger_s."""
    if rate <= 0 or connections < 1 or threads < 1:
        raise BenchmarkError(f"a per-connection schedule needs rate > 0, connections >= 1 and threads >= 1, "
                             f"got {rate}, {connections}, {threads}")
    period = connections / rate
    starts = [(index // threads) * stagger_s for index in range(connections)]
    turns = [(start, index) for index, start in enumerate(starts)]
    heapq.heapify(turns)
    while True:
        due, index = heapq.heappop(turns)
        yield due
        heapq.heappush(turns, (due + period, index))
