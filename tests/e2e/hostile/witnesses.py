"""Witnesses that a test's batch-mates really shared batches with its hostile requests, read from the
model's own metrics: the handler's HandlerBatches{BatchSize} counter, or, for a generating model,
the engine's GenerationPeakRunningSequences gauge."""

from __future__ import annotations

import threading
import time
from typing import Optional

import requests

from tests.e2e.hostile.served import Served


class Witness:
    """Proves that a test's batch-mates shared batches (no-op base)."""

    def start(self) -> None: ...

    def sent(self) -> None: ...

    def verify(self) -> None: ...


class Batches(Witness):
    """The handler's HandlerBatches{BatchSize} counter: each group's batch-mates (`least` items at
    least) formed one batch; a few groups may have been split by scheduling on a busy machine."""

    def __init__(self, served: Served, model: str, least: int) -> None:
        self.served, self.model, self.least, self.groups, self.before = served, model, least, 0, {}

    def start(self) -> None:
        self.before, self.groups = self.served.batches(self.model), 0

    def sent(self) -> None:
        self.groups += 1

    def verify(self) -> None:
        new = self.served.batches_since(self.model, self.before, items=self.groups * (self.least + 1))
        together = sum(n for size, n in new.items() if size >= self.least)
        assert together >= max(1, self.groups - self.groups // 5), (
            f"{self.model}: {self.groups} groups sent, only {together} batches of {self.least}+ items formed "
            f"({new}): the batch-mates did not share batches")


class RunningPeak(Witness):
    """A generating model: GenerationPeakRunningSequences (sequences one step advanced together)
    read while the test runs; at least two ran together."""

    def __init__(self, served: Served, model: str) -> None:
        self.served, self.model, self.peak = served, model, 0.0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _read(self) -> None:
        try:
            scrape = self.served.scrape()
            self.peak = max(self.peak, scrape.total(self.served.metric("GenerationPeakRunningSequences"), self.model))
        except (requests.RequestException, ValueError):
            pass

    def start(self) -> None:
        def loop():
            while not self._stop.wait(0.25):
                self._read()

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def verify(self) -> None:
        settled = time.monotonic() + 3.0 + self.served.metrics_wait_s  # the loop reports about once a second
        while self.peak < 2 and time.monotonic() < settled:
            time.sleep(0.25)
        self._stop.set()
        assert self.peak >= 2, f"{self.model}: no two sequences ever generated together (peak {self.peak})"

    def stop(self) -> None:
        self._stop.set()
