"""A run's time budget: a measurement that would not end within what is left is not started, and
the run reports what it measured and what it did not, never nothing.

Shared by the bench (its open-loop points) and the tuner (its candidates): each asks `allows`
before it starts something, with how long that takes at least.
"""

from __future__ import annotations

import time
from typing import Optional

from benchmarks.load.errors import BenchmarkError


class BudgetSpent(BenchmarkError):
    """Raised where the next measurement does not fit: its callers stop and report what they have."""


class Budget:
    """Seconds for a whole run from its start (None: no limit), and the measurements left out."""

    def __init__(self, seconds: Optional[float], clock=time.monotonic) -> None:
        if seconds is not None and seconds <= 0:
            raise BenchmarkError(f"a time budget must be > 0 s, got {seconds:g}")
        self.seconds = seconds
        self._clock = clock
        self._started = clock()
        self.left_out: list[str] = []

    def spent_s(self) -> float:
        return self._clock() - self._started

    def left_s(self) -> float:
        return float("inf") if self.seconds is None else self.seconds - self.spent_s()

    def allows(self, what: str, need_s: float) -> bool:
        """True when `what` (taking at least need_s) fits in what is left; else it is noted as left out."""
        if need_s <= self.left_s():
            return True
        self.left_out.append(f"{what} (needs {need_s:.0f} s, {max(0.0, self.left_s()):.0f} s left)")
        return False

    def require(self, what: str, need_s: float) -> None:
        if not self.allows(what, need_s):
            raise BudgetSpent(f"time budget of {self.seconds / 60:g} min spent: {self.left_out[-1]} not measured")

    def to_json(self) -> dict:
        return {"budget_s": self.seconds, "spent_s": round(self.spent_s(), 1), "left_out": list(self.left_out)}
