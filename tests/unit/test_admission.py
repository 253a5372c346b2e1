"""The admission policy both continuous-batching loops share (handlers/generation/admission.py), held
through each loop over a counting engine: for any arrivals (their times, priorities, lengths, bad
headers, sequences the engine cannot make), any `max_running` and any room in the engine's KV-cache
budget, every request is answered exactly once (an answer, or its own refusal), never more than
`max_running` normal or low sequences run, and a sequence the engine defers waits for room."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from handlers.errors import HandlerError, OutOfMemory
from handlers.generation.admission import HIGH, Admission, priority_level
from handlers.generation.door import Door
from handlers.generation.engine import Generation
from handlers.generation.engine_loop import Done, EngineLoop, Failed, Ticket
from handlers.generation.params import GenerationRequest
from handlers.generation.serving import GenerationService
from handlers.generation.text import TextStream
from tests.unit.conftest import fuzz_examples

pytestmark = pytest.mark.unit

POLICY = settings(derandomize=True, database=None, deadline=None, max_examples=fuzz_examples(150))
HEADERS = {0: "high", 1: "normal", 2: "low"}


class CountingEngine:
    """The Engine's batch bookkeeping without a model: a token per prefill and per step; a sequence
    ends at its max_new_tokens; at most `capacity` sequences fit its KV budget (0: no limit; one always
    fits alone), the rest of an admission is handed back. Records the most that ever ran together."""

    def __init__(self, unmakeable=frozenset(), capacity: int = 0) -> None:
        self.running: list[Generation] = []
        self.kv = None
        self.cache_bytes, self.prefix_cache = 0, None
        self.unmakeable = unmakeable
        self.capacity = capacity
        self.most_non_high = self.most_running = 0

    def new_sequence(self, key, request):
        if key in self.unmakeable:
            raise RuntimeError("a fault of ours with this request")
        return Generation(key, request, TextStream(lambda ids: "t" * len(ids)), None)

    def admit(self, sequences):
        room = max(self.capacity - len(self.running), 0 if self.running else 1) if self.capacity else len(sequences)
        sequences, deferred = list(sequences[:room]), list(sequences[room:])
        for seq in sequences:
            self._token(seq)
        self.running.extend(seq for seq in sequences if not seq.done)
        self.most_non_high = max(self.most_non_high, sum(seq.priority != HIGH for seq in self.running))
        self.most_running = max(self.most_running, len(self.running))
        return deferred

    def step(self):
        moved = list(self.running)
        for seq in moved:
            self._token(seq)
        self.running = [seq for seq in moved if not seq.done]
        return moved

    def drop(self, keys):
        gone = set(keys)
        removed = [seq for seq in self.running if seq.key in gone]
        self.running = [seq for seq in self.running if seq.key not in gone]
        return removed

    @staticmethod
    def _token(seq):
        seq.generated += 1
        seq.added = 1
        seq.token_times.append(time.perf_counter())
        seq.text.add(1)
        if seq.generated >= seq.request.max_new_tokens:
            seq.finish = "length"


def arrival(key):
    """(the iteration it arrives at, its X-Priority header, its new tokens, whether the engine can make it)"""
    return st.tuples(st.integers(0, 6), st.sampled_from(["high", "normal", "low", "urgent", None]),
                     st.integers(1, 5), st.booleans().map(lambda ok: ok or key % 7 != 3))


ARRIVALS = st.integers(0, 10).flatmap(lambda n: st.tuples(*(arrival(k) for k in range(n))))


def request(new_tokens: int) -> GenerationRequest:
    return GenerationRequest(prompt="-", prompt_ids=(1,), max_new_tokens=new_tokens)


# ---- the async engine loop -------------------------------------------------------------------
@POLICY
@given(arrivals=ARRIVALS, max_running=st.integers(0, 3), capacity=st.integers(0, 3))
def test_the_engine_loop_answers_every_request_once_within_max_running(arrivals, max_running, capacity):
    engine = CountingEngine({f"r{k}" for k, (*_, ok) in enumerate(arrivals) if not ok}, capacity)
    loop = EngineLoop(engine, max_running)
    events: dict[str, list] = {}
    expected = {}
    for turn in range(60):
        for k, (at, header, n, _) in enumerate(arrivals):
            key = f"r{k}"
            if at != turn:
                continue
            level = priority_level(header)
            if isinstance(level, HandlerError):  # refused at the door (async_serving.py), never submitted
                continue
            expected[key] = n
            loop.submit(Ticket(key, request(n), lambda event, key=key: events.setdefault(key, []).append(event), level))
        loop.iterate()
    assert set(events) == set(expected)
    for key, got in events.items():
        finals = [e for e in got if isinstance(e, (Done, Failed))]
        assert len(finals) == 1 and got[-1] is finals[0], (key, got)
        if key in engine.unmakeable:
            assert isinstance(finals[0], Failed) and finals[0].error.status == 500
        else:
            assert isinstance(finals[0], Done) and finals[0].generated_tokens == expected[key]
    assert max_running == 0 or engine.most_non_high <= max_running
    assert capacity == 0 or engine.most_running <= capacity
    assert loop.admission.waiting == [] and engine.running == []


# ---- the step-per-call loop ------------------------------------------------------------------
class StepContext:
    """What the step loop writes into TorchServe's context."""

    def __init__(self, ids: list[str]) -> None:
        self.request_ids = dict(enumerate(ids))
        self.stopping_criteria = None
        self.statuses: dict[int, int] = {}

    def set_response_content_type(self, idx, media_type):
        pass


def step_door(headers: dict[str, str]) -> Door:
    def decode(bodies, context, indices):
        return [request(json.loads(body)["n"]) for body in bodies]

    def fail(context, idx, err):
        context.statuses[idx] = err.status
        return json.dumps({"code": err.status}).encode()

    return Door(decode, fail, stream=lambda context, chunks: None,
                priority=lambda context, idx: headers.get(context.request_ids[idx]))


@POLICY
@given(arrivals=ARRIVALS, max_running=st.integers(0, 3), capacity=st.integers(0, 3), continuous=st.booleans())
def test_the_step_loop_answers_every_request_once_within_max_running(arrivals, max_running, capacity, continuous):
    """Continuous batching (a step per call) or a whole batch per call."""
    engine = CountingEngine({f"r{k}" for k, (*_, ok) in enumerate(arrivals) if not ok}, capacity)
    headers = {f"r{k}": header for k, (_, header, _, _) in enumerate(arrivals) if header is not None}
    service = GenerationService(engine, "m", continuous, step_door(headers), max_running=max_running)
    finals: dict[str, list] = {}
    running: list[str] = []
    for turn in range(60):  # as TorchServe's frontend: the running requests (no body), then the new ones
        new = [(f"r{k}", n) for k, (at, _, n, _) in enumerate(arrivals) if at == turn]
        ids = running + [key for key, _ in new]
        if not ids:
            continue
        data = [{} for _ in running] + [json.dumps({"n": n}).encode() for _, n in new]
        context = StepContext(ids)
        answers = service.handle(data, context)
        running = []
        for idx, (key, answer) in enumerate(zip(ids, answers)):
            more = None if context.stopping_criteria is None else context.stopping_criteria[idx](None)
            if more is False:
                running.append(key)
            else:
                finals.setdefault(key, []).append((context.statuses.get(idx, 200), answer))
    assert running == [] and set(finals) == {f"r{k}" for k in range(len(arrivals))}
    for k, (_, header, n, ok) in enumerate(arrivals):
        (status, answer), *again = finals[f"r{k}"]
        assert not again
        if isinstance(priority_level(header), HandlerError):
            assert status == 400
        elif not ok:
            assert status == 500
        else:
            assert status == 200 and json.loads(answer)["generated_tokens"] == n
    assert not continuous or max_running == 0 or engine.most_non_high <= max_running
    assert capacity == 0 or engine.most_running <= capacity
    assert service.waiting == [] and service.live == {}


# ---- the policy itself ----------------------------------------------------------------------
def test_high_first_then_normal_then_low_each_in_arrival_order_and_high_past_the_limit():
    admission = Admission(max_running=1)
    engine = CountingEngine()
    made = [Admission.make(engine, key, request(2), level)
            for key, level in [("l1", 2), ("n1", 1), ("h1", 0), ("l2", 2), ("n2", 1), ("h2", 0)]]
    admission.wait(made)
    assert [seq.key for seq in admission.waiting] == ["h1", "h2", "n1", "n2", "l1", "l2"]
    assert [seq.key for seq in admission.starting([])] == ["h1", "h2", "n1"]
    assert [seq.key for seq in admission.starting(made[1:2])] == []  # n1 runs: the one place is taken
    admission.leave(["n2"])
    assert [seq.key for seq in admission.starting([])] == ["l1"]


def test_a_bad_priority_header_is_a_400_naming_it_and_a_sequence_not_made_is_a_500():
    assert priority_level(None) == 1 and priority_level(" HIGH ") == 0
    refused = priority_level("urgent\r\n")
    assert refused.status == 400 and "X-Priority" in refused.message
    fault = Admission.make(CountingEngine({"k"}), "k", request(1), 1)
    assert isinstance(fault, HandlerError) and fault.status == 500


def test_the_engines_own_refusal_of_a_sequence_is_kept():
    class OverBudget(CountingEngine):
        def new_sequence(self, key, request):
            raise OutOfMemory("this request's KV cache would be over the worker's budget")

    refused = Admission.make(OverBudget(), "big", request(1), 1)
    assert isinstance(refused, OutOfMemory) and refused.status == 507
