"""The response cache inside one batch: answers the cache already has, and identical requests of the
batch computed once (handlers/response_cache.py keeps the answers).

A group of identical requests is computed through one member, its representative; the others get
its answer. Each member keeps its own fate otherwise: a member whose own deadline passes gets its
own 504, and a group whose representative leaves that way is computed through its next member
still waiting. A request whose body cannot be keyed (a form with several fields, say) is refused
alone; one that cannot be canonicalised is simply not cached.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Optional

from handlers.encoding import JSON
from handlers.errors import HandlerError
from handlers.response_cache import ResponseCache, coalesce, request_key
from handlers.stage_metrics import emit_cache


@dataclass
class Repeats:
    """One batch's identical requests: member -> its group's representative (representatives are
    not keys), and each cacheable request's key."""

    keys: dict[int, bytes] = field(default_factory=dict)
    first_of: dict[int, int] = field(default_factory=dict)

    def members(self) -> list[int]:
        return list(self.first_of)

    def leave(self, gone: Iterable[int]) -> dict[int, int]:
        """Requests that leave the batch with an answer of their own (a 504). A group whose
        representative left is represented by its next member still here; returns each such
        representative -> its successor."""
        gone = set(gone)
        for idx in gone & set(self.first_of):
            del self.first_of[idx]
        moved: dict[int, int] = {}
        for member, first in sorted(self.first_of.items()):
            if first in gone:
                moved.setdefault(first, member)
        for member, first in list(self.first_of.items()):
            if first in moved:
                if member == moved[first]:
                    del self.first_of[member]
                else:
                    self.first_of[member] = moved[first]
        return moved


def follow(indices: Iterable[int], moved: dict[int, int], gone: Iterable[int]) -> list[int]:
    """The representatives after `Repeats.leave`: a successor in its predecessor's place."""
    gone = set(gone)
    return [moved.get(idx, idx) for idx in indices if idx not in gone or idx in moved]


class BatchCache:
    """The response cache as the request loop uses it, once per batch."""

    def __init__(self, cache: ResponseCache, model_name: str) -> None:
        self.cache = cache
        self.model_name = model_name

    def lookup(self, identity: tuple[str, str], live: list[int], key_of: Callable[[int], Optional[tuple[Any, str]]],
               context, results: list[Optional[bytes]],
               refuse: Callable[[int, HandlerError], None]) -> tuple[Repeats, list[int]]:
        """Answer what the cache has among `live`; returns the batch's repeats and the requests
        still to compute (each group's representative). `identity`: the archive's version and
        variant; `key_of(idx)`: the request's (body, content type) when it may be cached, else None;
        a HandlerError it raises refuses that request alone."""
        repeats, todo = Repeats(), []
        for idx in live:
            try:
                keyed = key_of(idx)
            except HandlerError as err:
                refuse(idx, err)
                continue
            if keyed is not None:
                key = request_key(self.model_name, *identity, *keyed)
                if key is not None:
                    repeats.keys[idx] = key
            answer = self.cache.get(repeats.keys[idx]) if idx in repeats.keys else None
            if answer is None:
                todo.append(idx)
            else:
                results[idx] = answer
                context.set_response_content_type(idx, JSON)
        first = coalesce([repeats.keys.get(idx) for idx in todo])
        repeats.first_of = {todo[i]: todo[j] for i, j in first.items() if i != j}
        return repeats, [idx for idx in todo if idx not in repeats.first_of]

    def remember(self, repeats: Repeats, context, results: list[Optional[bytes]], refused: dict[int, HandlerError],
                 reject: Callable[[Any, int, HandlerError], bytes]) -> None:
        """Give each member its group's answer (or its refusal: the body is the same) and keep the
        computed answers."""
        for idx, first in repeats.first_of.items():
            if first in refused:
                refused[idx] = refused[first]
                results[idx] = reject(context, idx, refused[first])
            else:
                results[idx] = results[first]
                context.set_response_content_type(idx, JSON)
        for idx, key in repeats.keys.items():
            if idx not in refused and idx not in repeats.first_of and results[idx] is not None:
                self.cache.put(key, results[idx])
        emit_cache(getattr(context, "metrics", None), self.model_name, self.cache)
