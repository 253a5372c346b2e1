"""One request's state through the batch loop (`Job`), and one batch between the loop's two stages
(`Prepared`): what Handler.prepare decided and decoded, and what Handler.complete needs to answer it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from handlers.deadlines import BatchDeadlines
from handlers.errors import HandlerError
from handlers.protocols import Protocol, Reply, Unwrapped
from handlers.request import Request
from handlers.stage_metrics import StageClock

SERVED, REFUSED, CACHED = "served", "refused", "cached"  # how a request left the batch (its trace says)


@dataclass(eq=False)
class Job:
    """One request of a batch: its record, its protocol, and everything the loop decides about it."""

    request: Request
    protocol: Protocol  # the route's; once unwrapped, the protocol that answers it
    unwrapped: Optional[Unwrapped] = None
    items: list[Any] = field(default_factory=list)  # decoded, one per instance
    first: int = 0  # where its items start in the forward pass
    reply: Optional[Reply] = None
    error: Optional[HandlerError] = None  # what refused it, once refused
    key: Optional[bytes] = None  # its response-cache key, when it may be cached
    leader: Optional[Job] = None  # the identical request of the batch computed for it (handlers/repeats.py)
    computed: bool = False  # went through the forward pass

    @property
    def outcome(self) -> str:
        return SERVED if self.computed else REFUSED if self.error is not None else CACHED

    def refuse(self, err: HandlerError) -> None:
        self.error = err
        self.reply = self.protocol.error(err)


@dataclass
class Prepared:
    """One batch between the request loop's two stages (Handler.prepare, Handler.complete)."""

    jobs: list[Job]
    clock: StageClock
    deadlines: BatchDeadlines = field(default_factory=BatchDeadlines)
    computing: list[Job] = field(default_factory=list)  # accepted, in forward-pass order
    decoded: list[Any] = field(default_factory=list)  # their items, before collating
    inputs: Any = None  # the collated batch

    @property
    def items(self) -> int:
        return len(self.decoded)
