"""The response cache inside one batch: answers the cache already has, and identical requests of the
batch computed once (handlers/response_cache.py keeps the answers).

A group of identical requests is computed through one member, its leader; the others (`Job.leader`
set) get its answer. Each member keeps its own fate otherwise: a member whose own deadline passes gets
its own 504, and a group whose leader leaves that way is computed through its next member still
waiting. Only /predictions answers are cached, and not when the client asked for a fresh one
(Cache-Control: no-cache); a body that cannot be canonicalised is simply not cached.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

from handlers.errors import BadInput
from handlers.prepared import Job
from handlers.protocols import Reply
from handlers.request import PLAIN, Request
from handlers.response_cache import ResponseCache, request_key
from handlers.stage_metrics import emit_cache


def cache_key(request: Request, model_name: str, identity: tuple[str, str]) -> Optional[bytes]:
    """The key a request's answer is kept under, or None when it may not be cached. A JSON body is
    canonicalised from the record's one parse (which the family then reuses)."""
    if request.route != PLAIN or request.no_cache or request.error is not None:
        return None
    body = request.body
    if isinstance(body, (bytes, bytearray)) and request.media_type == "application/json":
        try:
            body = request.json
        except BadInput:  # not JSON after all: keyed as sent (its error answer is not cached)
            return request_key(model_name, *identity, bytes(body), request.media_type, canonical=bytes(body))
    return request_key(model_name, *identity, body, request.media_type)


def leave(jobs: Iterable[Job], gone: Iterable[Job]) -> dict[Job, Job]:
    """Requests that leave the batch with an answer of their own (a 504). A group whose leader left
    is led by its next member still here; returns each such leader -> its successor."""
    gone = set(gone)
    members = [job for job in jobs if job.leader is not None]
    for job in members:
        if job in gone:
            job.leader = None
    moved: dict[Job, Job] = {}
    for job in members:
        if job.leader is not None and job.leader in gone:
            old = job.leader
            if old not in moved:
                moved[old] = job
                job.leader = None
            else:
                job.leader = moved[old]
    return moved


def follow(leaders: Iterable[Job], moved: dict[Job, Job], gone: Iterable[Job]) -> list[Job]:
    """The leaders after `leave`: a successor in its predecessor's place."""
    gone = set(gone)
    return [moved.get(job, job) for job in leaders if job not in gone or job in moved]


class BatchCache:
    """The response cache as the request loop uses it, once per batch."""

    def __init__(self, cache: ResponseCache, model_name: str) -> None:
        self.cache = cache
        self.model_name = model_name

    def lookup(self, live: list[Job], identity: tuple[str, str]) -> list[Job]:
        """Answer what the cache has among `live`, group the rest by key; returns the requests still
        to compute (each group's leader). `identity`: the archive's version and variant."""
        todo: list[Job] = []
        first: dict[bytes, Job] = {}
        for job in live:
            job.key = cache_key(job.request, self.model_name, identity)
            answer = None if job.key is None else self.cache.get(job.key)
            if answer is not None:
                job.reply = Reply(answer)
                continue
            if job.key is not None and job.key in first:
                job.leader = first[job.key]
                continue
            if job.key is not None:
                first[job.key] = job
            todo.append(job)
        return todo

    def remember(self, jobs: list[Job], metrics) -> None:
        """Give each member its group's answer (or its refusal: the body is the same) and keep the
        computed answers."""
        for job in jobs:
            if job.leader is None:
                continue
            if job.leader.error is not None:
                job.refuse(job.leader.error)
            else:
                job.reply = job.leader.reply
        for job in jobs:
            if job.key is not None and job.error is None and job.leader is None and job.reply is not None:
                self.cache.put(job.key, job.reply.body)
        emit_cache(metrics, self.model_name, self.cache)
