"""One batch between the request loop's two stages: what Handler.prepare decided and decoded (refusals,
cached answers, deadlines, the collated inputs) and what Handler.complete needs to answer it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from handlers import kserve
from handlers.deadlines import BatchDeadlines
from handlers.errors import HandlerError
from handlers.repeats import Repeats
from handlers.stage_metrics import StageClock


@dataclass
class Prepared:
    """One batch between the request loop's two stages (Handler.prepare, Handler.complete)."""

    context: Any
    size: int  # requests in the batch
    clock: StageClock
    results: list[Optional[bytes]]  # per request: its answer, once it has one
    refused: dict[int, HandlerError] = field(default_factory=dict)
    deadlines: Optional[BatchDeadlines] = None
    repeats: Repeats = field(default_factory=Repeats)  # the batch's identical requests (handlers/repeats.py)
    # Per accepted request: (its index, its envelope or None, where its items start, how many).
    spans: list[tuple[int, Optional[kserve.Envelope], int, int]] = field(default_factory=list)
    items: int = 0  # items in the forward pass
    decoded: list[Any] = field(default_factory=list)  # those items, before collating
    inputs: Any = None  # the collated batch
