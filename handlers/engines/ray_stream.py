"""Ray Serve's adapter for the causal LM's async engine (serving/ray/generation.py runs it): the Ray
adapter (ray.py: records in, Replies out), plus where a request's streamed chunks go.

The async engine loop (handlers/generation/async_serving.py) hands each engine step's chunks to
`send_step` as (context, request, chunk) triples, the context being the one its request came with.
On Ray every request comes with a `StreamContext` of its own, whose `sink` is the replica's queue for
that request's response: each chunk goes there, for the replica to send as it comes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from handlers.engines.ray import Ray, RayContext
from handlers.protocols import Reply
from handlers.request import Request

Sink = Callable[[Reply], None]


def _discard(chunk: Reply) -> None:
    return None


@dataclass(frozen=True)
class StreamContext(RayContext):
    """The replica's context (start-up: chunks go nowhere) or one request's (`for_request`)."""

    sink: Sink = _discard

    def for_request(self, sink: Sink) -> StreamContext:
        return replace(self, sink=sink)


class RayStream(Ray):
    """The engine adapter of a generating replica on Ray Serve (stateless: contexts hold the sinks)."""

    @staticmethod
    def send_step(parts: Sequence[tuple[Any, Request, Reply]]) -> None:
        """Each chunk to its own request's sink (see the module's docstring)."""
        for context, _, chunk in parts:
            context.sink(chunk)
