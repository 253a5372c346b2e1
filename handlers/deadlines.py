"""Per-request deadlines: a request whose answer would come too late is answered 504, not computed.

A request's budget is its `X-Request-Timeout-Ms` header, else the model's `runtime.deadline_ms`
(0: no deadline). The budget counts from `X-Request-Start-Ms` (Unix time in ms, stamped by the
client or a proxy in front of TorchServe) when the request carries it, else from the moment this
worker received the batch. TorchServe 0.12 does not tell a worker when its frontend received a
request: the frontend's encoder (`ModelRequestEncoder.encodeRequest`) sends the request id, the
headers and the body only, and the arrival time (`Job.begin`) stays in the frontend. Without the
start header, time spent in the frontend's queue and batch delay is therefore not counted.

The request loop checks twice: when the batch arrives (an expired request is not even decoded) and
again just before the forward pass (decoding its batch-mates may have used up its budget). A request
is dropped at a check when its deadline has passed, or when less of its budget is left than the
worker's recent time from that check to a batch's answers (`ServiceTime`): under overload a request
picked up just before its deadline would otherwise be computed and still answered late. The
requests left run as a smaller batch. Header names match in any case (the frontend forwards them as
the client spelled them).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from handlers.errors import BadInput, DeadlineExceeded

TIMEOUT_HEADER = "X-Request-Timeout-Ms"
START_HEADER = "X-Request-Start-Ms"
MAX_TIMEOUT_MS = 3_600_000  # an hour: anything longer is a unit mistake, not a deadline
# A start stamp is refused when it lies further ahead of this worker's clock than this (clock skew
# or a wrong unit), or further behind than MAX_TIMEOUT_MS (seconds sent as milliseconds, say).
MAX_CLOCK_AHEAD_MS = 60_000
BEFORE_DECODE = "before_decode"
BEFORE_INFERENCE = "before_inference"
_DIGITS = re.compile(r"[0-9]{1,16}")


@dataclass(frozen=True)
class Arrival:
    """When this worker received the batch, on both clocks: monotonic to measure, wall to compare
    with a client's start stamp."""

    monotonic: float
    wall_ms: float

    @classmethod
    def now(cls) -> Arrival:
        return cls(time.monotonic(), time.time() * 1000.0)


@dataclass(frozen=True)
class Due:
    """One request's deadline (monotonic seconds) and what it was made of, for the 504's message."""

    at: float
    budget_ms: int
    source: str  # which setting gave the budget
    counted_from: str  # what the budget counts from

    def message(self, stage: str, now: float, needed_s: float) -> str:
        where = "before it was decoded" if stage == BEFORE_DECODE else "before the model ran"
        left_ms = (self.at - now) * 1000.0
        why = "ran out" if left_ms <= 0 else (f"had {left_ms:.0f} ms left, less than the {needed_s * 1000:.0f} ms this "
                                                "worker recently took to answer a batch,")
        return (f"deadline exceeded: the budget of {self.budget_ms} ms ({self.source}, counted from "
                f"{self.counted_from}) {why} {where}; the request was not computed")


@dataclass
class ServiceTime:
    """The worker's recent time from each check to its batch's answers (moving averages, seconds);
    0 until a batch has been computed."""

    before_decode_s: float = 0.0
    before_inference_s: float = 0.0
    weight: float = 0.2  # of the newest batch

    def needed(self, stage: str) -> float:
        return self.before_decode_s if stage == BEFORE_DECODE else self.before_inference_s

    def update(self, elapsed_ms: Mapping[str, float]) -> None:
        """One computed batch's stage times (handlers/stage_metrics.StageClock.elapsed_ms)."""
        after_decode = (elapsed_ms.get("inference", 0.0) + elapsed_ms.get("postprocess", 0.0)) / 1000.0
        whole = after_decode + elapsed_ms.get("preprocess", 0.0) / 1000.0
        first = self.before_decode_s == 0.0 and self.before_inference_s == 0.0
        w = 1.0 if first else self.weight
        self.before_decode_s += w * (whole - self.before_decode_s)
        self.before_inference_s += w * (after_decode - self.before_inference_s)


def _whole_ms(headers: Mapping[str, Any], name: str) -> Optional[int]:
    value = headers.get(name.lower())  # the request's headers, folded at the door (handlers/request.py)
    if value is None:
        return None
    text = value.strip()
    if not _DIGITS.fullmatch(text):
        raise BadInput(f"{name}: {value[:40]!r} is not a whole number of milliseconds", param=name)
    return int(text)


def due_of(headers: Mapping[str, Any], default_ms: int, arrival: Arrival) -> Optional[Due]:
    """A request's deadline from its headers and the model's default; None when it has none.
    Raises BadInput naming the header when a value is malformed or out of range."""
    timeout = _whole_ms(headers, TIMEOUT_HEADER)
    if timeout is not None and not 1 <= timeout <= MAX_TIMEOUT_MS:
        raise BadInput(f"{TIMEOUT_HEADER}: {timeout} is outside 1..{MAX_TIMEOUT_MS}", param=TIMEOUT_HEADER)
    start = _whole_ms(headers, START_HEADER)
    if start is not None and not arrival.wall_ms - MAX_TIMEOUT_MS <= start <= arrival.wall_ms + MAX_CLOCK_AHEAD_MS:
        raise BadInput(f"{START_HEADER}: {start} is not a Unix time in milliseconds within the last hour (this "
                       f"worker's clock reads {arrival.wall_ms:.0f})", param=START_HEADER)
    budget = timeout if timeout is not None else default_ms
    if not budget:
        return None
    source = TIMEOUT_HEADER if timeout is not None else "runtime.deadline_ms"
    if start is None:
        return Due(arrival.monotonic + budget / 1000.0, budget, source, "the worker's receipt of its batch")
    # A stamp slightly ahead of this clock (skew) counts as sent now.
    waited_ms = max(0.0, arrival.wall_ms - start)
    return Due(arrival.monotonic + (budget - waited_ms) / 1000.0, budget, source, START_HEADER)


@dataclass
class BatchDeadlines:
    """What became of one batch's deadlines, for the handler's counters. Each request's own deadline
    is its record's `due` (decided at the door, handlers/request.py)."""

    expired: dict[str, int] = field(default_factory=dict)  # stage -> requests answered 504 there
    late: int = 0  # requests computed but answered after their deadline (still 200)

    def expire(self, dues: Iterable[tuple[Any, Optional[Due]]], stage: str,
               service: ServiceTime) -> list[tuple[Any, DeadlineExceeded]]:
        """Of `dues` ((a request's state, its deadline or None) pairs), those that cannot be answered in
        time any more, each with its 504."""
        now = time.monotonic()
        needed = service.needed(stage)
        out = [(who, DeadlineExceeded(due.message(stage, now, needed))) for who, due in dues
               if due is not None and due.at <= now + needed]
        if out:
            self.expired[stage] = self.expired.get(stage, 0) + len(out)
        return out

    def count_late(self, dues: Iterable[Optional[Due]]) -> None:
        now = time.monotonic()
        self.late += sum(1 for due in dues if due is not None and due.at < now)
