"""The contract a hostile request is held to, on a real engine: TorchServe or Ray Serve
(tests/e2e/hostile/served.py; requests travel by tests/e2e/hostile/transport.py; batching is
witnessed by tests/e2e/hostile/witnesses.py).

For every probe (one hostile request) `Contract.hold`:
- sends it together with good batch-mates (a barrier releases them at once; the server's batch
  delay is long enough that they share one batch, which `Batches` / `RunningPeak` verify from the
  model's own metrics when the test ends);
- the probe: a 4xx whose body names what is wrong (REFUSE), or a 200 with a well-formed answer
  (ANSWER), or either of the two (EITHER); never a 5xx, never no answer within the timeout, never
  a reply that is not valid HTTP;
- every batch-mate: 200 with the answer it gets alone (its `judge`);
- the model's worker pids unchanged (TorchServe's workers, Ray's replicas), and the next request
  answered.

Every call has a timeout: a hang is a failure, never a stuck run. A model that answers nothing when
a test starts (a previous test's failure) gets a fresh worker first, so one failure does not
cascade into the next test. Hypothesis runs a fixed, deterministic budget (HOSTILE_EXAMPLES raises
it; HOSTILE_SEED=<n> draws other examples) and stops at the first failure (no shrinking: every
example costs real requests).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from hypothesis import HealthCheck, Phase, example, given, seed, settings
from hypothesis.strategies import SearchStrategy

from tests.e2e.hostile.transport import GRPC, Reply, Request, Sender
from tests.e2e.hostile.witnesses import Batches, RunningPeak, Witness

__all__ = ["REFUSE", "ANSWER", "EITHER", "FRONTEND_500", "GRPC", "Expect", "Probe", "Mate", "Judge", "Request", "Reply", "Sender",
           "Contract", "Batches", "RunningPeak", "Witness", "attack", "problems"]

REFUSE, ANSWER, EITHER = "refuse", "answer", "either"
# TorchServe 0.12's frontend answers a few bad requests itself with a 500, before any worker sees them
# (docs/api.md#errors): that exact reply, naming its cause, and nothing else lost.
FRONTEND_500 = "frontend 500"
CANARY_TIMEOUT_S = 10.0  # whether a model answers at all (before a test, after a broken contract)


def hostile(examples: int):
    """Hypothesis settings for a hostile test: `examples` (or HOSTILE_EXAMPLES) per test, no deadline,
    derandomised (or HOSTILE_SEED), no database, no shrinking, every health check off (the
    examples are real requests to a real server)."""
    count = int(os.environ.get("HOSTILE_EXAMPLES") or examples)
    chosen = os.environ.get("HOSTILE_SEED")

    def wrap(test):
        test = settings(max_examples=count, deadline=None, derandomize=chosen is None, database=None,
                        phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck),
                        report_multiple_bugs=False, print_blob=False)(test)
        return test if chosen is None else seed(int(chosen))(test)

    return wrap


@dataclass(frozen=True)
class Expect:
    outcome: str  # REFUSE, ANSWER or EITHER
    status: Optional[int] = None  # REFUSE: this exact status (None: any 4xx)
    words: tuple[str, ...] = ()  # REFUSE: one of them in the message (case-insensitive)

    def __repr__(self) -> str:
        return self.outcome + (f" {self.status}" if self.status else "") + (f" naming {self.words}" if self.words else "")


Judge = Callable[[Reply], Optional[str]]  # what is wrong with a 200's answer, or None


@dataclass(frozen=True)
class Probe:
    request: Request
    expect: Expect
    judge: Judge  # applied to a 200
    label: str = ""


@dataclass(frozen=True)
class Mate:
    """A good request and its judge (well formed, and the answer it gets alone)."""

    request: Request
    judge: Judge


def problems(reply: Reply, expect: Expect, judge: Judge) -> list[str]:
    """What breaks the contract in this reply, or nothing."""
    if reply.status == 0:
        return [reply.problem]
    if expect.outcome == FRONTEND_500:
        named = any(w.lower() in (reply.message or reply.body.decode("utf-8", "replace")).lower() for w in expect.words)
        return [] if reply.status == 500 and named else [f"{reply.status}, expected TorchServe's own 500 naming "
                                                         f"{list(expect.words)}: {reply.body[:200]!r}"]
    if reply.status >= 500:
        return [f"{reply.status}: a fault for a client's request ({reply.message or reply.problem or reply.body[:200]!r})"]
    if reply.status == 200:
        if expect.outcome == REFUSE:
            return [f"200 for a request that must be refused: {reply.body[:200]!r}"]
        wrong = judge(reply)
        return [f"200 with a wrong answer: {wrong}"] if wrong else []
    if not 400 <= reply.status < 500:
        return [f"status {reply.status}: {reply.body[:200]!r}"]
    found = []
    if expect.outcome == ANSWER:
        found.append(f"{reply.status} for a valid request: {reply.message!r}")
    if not reply.message.strip():
        found.append(f"{reply.status} whose body names nothing: {reply.body[:200]!r}")
    if expect.status is not None and reply.status != expect.status:
        found.append(f"{reply.status}, expected {expect.status}: {reply.message!r}")
    if expect.words and not any(w.lower() in reply.message.lower() for w in expect.words):
        found.append(f"the message names none of {list(expect.words)}: {reply.message!r}")
    return found


class Contract:
    """One model's contract. Use as a context manager around the hypothesis run: on entry the model
    answers `canary` (or gets a fresh worker: a previous test's failure must not cascade), on a
    clean exit the witness verifies the batching. Each probe goes out with `mates()` (built on first
    use, after the canary: their references are answers alone), the first of which is then sent
    again as the next request."""

    def __init__(self, sender: Sender, model: str, canary: Request, mates: Callable[[], Sequence[Mate]],
                 witness: Witness) -> None:
        self.sender, self.served, self.model = sender, sender.served, model
        self.canary, self.mates, self.witness = canary, mates, witness

    # Models no fresh worker could bring back, with why: their later tests fail at once, not after a wait.
    unrecoverable: dict[tuple[int, str], str] = {}

    def __enter__(self) -> Contract:
        key = (id(self.served), self.model)
        if key in self.unrecoverable:
            raise AssertionError(f"{self.model} has not answered since an earlier test: {self.unrecoverable[key]}")
        try:
            pids = self.ready_pids()
            if self.sender.send(self.canary, CANARY_TIMEOUT_S).status != 200:
                self.restart(pids)
                if self.sender.send(self.canary, CANARY_TIMEOUT_S).status != 200:
                    raise AssertionError(f"{self.model} answers nothing, even from a fresh worker")
        except AssertionError as err:
            self.unrecoverable[key] = str(err)
            raise
        self.witness.start()
        return self

    def __exit__(self, kind, *_) -> None:
        if kind is None:
            self.witness.verify()
        elif isinstance(self.witness, RunningPeak):
            self.witness.stop()

    def restart(self, pids: tuple[int, ...]) -> None:
        print(f"[hostile] {self.model} answers nothing: a fresh worker in place of {pids}", file=sys.stderr, flush=True)
        self.served.fresh_worker(self.model, pids)

    def ready_pids(self) -> tuple[int, ...]:
        return self.served.ready_pids(self.model)

    def hold(self, probe: Probe) -> None:
        mates = list(self.mates())
        pids = self.ready_pids()
        replies = self.sender.together([probe.request, *(m.request for m in mates)])
        expect = probe.expect
        if expect.outcome == FRONTEND_500 and not self.served.frontend_500:  # no Java frontend: the handler's call
            expect = Expect(EITHER)
        found = [f"the hostile request: {p}" for p in problems(replies[0], expect, probe.judge)]
        for i, (mate, reply) in enumerate(zip(mates, replies[1:])):
            found += [f"batch-mate {i} ({mate.request.path}): {p}" for p in problems(reply, Expect(ANSWER), mate.judge)]
        now = self.served.worker_pids(self.model)
        if now != pids:
            found.append(f"worker pids {pids} -> {now}: the worker died")
        after = mates[0]  # once the contract is broken, the next request only says whether the model still answers
        reply = self.sender.send(after.request, CANARY_TIMEOUT_S if found else None)
        found += [f"the next request: {p}" for p in problems(reply, Expect(ANSWER), after.judge)]
        self.witness.sent()
        if found:
            raise AssertionError("\n".join([f"{self.model}: {probe.label} (expected {probe.expect!r})",
                                            f"  sent {probe.request!r}", *(f"  - {p}" for p in found)]))


def attack(contract: Contract, strategy: SearchStrategy, to_probe: Callable[[Any], Probe], examples: int,
           explicit: Sequence[Any] = ()) -> None:
    """Hold `contract` for `explicit` and then `examples` draws of `strategy` (the engine's share of
    them: tests/e2e/hostile/served.py), each made a probe by `to_probe`; on success, the contract's
    witness verifies the batching."""
    with contract:
        @hostile(max(1, round(examples * contract.served.examples_share)))
        @given(strategy)
        def run(drawn):
            contract.hold(to_probe(drawn))

        for value in reversed(explicit):
            run = example(value)(run)
        run()
