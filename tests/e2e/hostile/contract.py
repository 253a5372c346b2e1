"""The contract a hostile request is held to, on a real TorchServe, and how each one goes out.

For every probe (one hostile request) `Contract.hold`:
- sends it together with good batch-mates (a barrier releases them at once; the server's batch
  delay is long enough that they share one batch, which `Batches` / `RunningPeak` verify from the
  model's own metrics when the test ends);
- the probe: a 4xx whose body names what is wrong (REFUSE), or a 200 with a well-formed answer
  (ANSWER), or either of the two (EITHER); never a 5xx, never no answer within the timeout, never
  a reply that is not valid HTTP;
- every batch-mate: 200 with the answer it gets alone (its `judge`);
- the model's worker pids unchanged (`GET /models/<m>`), and the next request answered.

Every call has a timeout: a hang is a failure, never a stuck run. A model that answers nothing when
a test starts (a previous test's failure) gets a fresh worker first, so one failure does not
cascade into the next test. Hypothesis runs a fixed, deterministic budget (HOSTILE_EXAMPLES raises
it; HOSTILE_SEED=<n> draws other examples) and stops at the first failure (no shrinking: every
example costs real requests).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Optional

import grpc
import requests
from hypothesis import HealthCheck, Phase, seed, settings

from benchmarks.load.server_metrics import Scrape
from serving.grpc_client import GrpcClient, error_message, refusal
from serving.launcher import TorchServe
from tests.e2e.helpers import batches_since, formed_batches
from tests.e2e.hostile import raw_http

REFUSE, ANSWER, EITHER = "refuse", "answer", "either"
TIMEOUT_S = float(os.environ.get("HOSTILE_TIMEOUT_S", "30"))
READY_TIMEOUT_S = 180.0
CANARY_TIMEOUT_S = 10.0  # whether a model answers at all (before a test, after a broken contract)
GRPC = "grpc:"  # Request.path prefix: grpc:Predictions/<model>, grpc:StreamPredictions/<model>

# gRPC status -> the HTTP status TorchServe maps to it (GRPCUtils at v0.12.0); DEADLINE_EXCEEDED and
# CANCELLED mean no answer in time. UNIMPLEMENTED is a refusal only where StreamPredictions is asked
# of a model that answers in one piece (the one call it may refuse that way).
_GRPC_STATUS = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.FAILED_PRECONDITION: 400,
                grpc.StatusCode.OUT_OF_RANGE: 416, grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.ABORTED: 409,
                grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.UNAUTHENTICATED: 401,
                grpc.StatusCode.RESOURCE_EXHAUSTED: 413, grpc.StatusCode.UNAVAILABLE: 503,
                grpc.StatusCode.INTERNAL: 500, grpc.StatusCode.UNKNOWN: 500, grpc.StatusCode.DATA_LOSS: 500}


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


@dataclass(frozen=True)
class Request:
    """A POST to `path` (REST), or `grpc:<Method>/<model>` (gRPC: no content type, no headers)."""

    path: str
    body: bytes
    content_type: Optional[str] = None  # None: no Content-Type header
    headers: tuple[tuple[str, str], ...] = ()
    strict: bool = False  # REST: over a plain socket, the reply's bytes checked (tests/e2e/hostile/raw_http.py)

    def __repr__(self) -> str:
        return f"POST {self.path} {self.content_type!r} {len(self.body)} B: {self.body[:200]!r}"


@dataclass(frozen=True)
class Reply:
    status: int  # 0: no valid reply in time
    body: bytes
    message: str  # the error message its body carries
    problem: str = ""  # status 0: why
    headers: Mapping[str, str] = field(default_factory=dict)  # names lower-cased (REST only)


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


def body_message(body: bytes) -> str:
    """The error text of TorchServe's {"code", "type", "message"}, KServe's {"error": "..."} or
    OpenAI's {"error": {"message": ...}}; "" when the body carries none."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return ""
    if not isinstance(doc, dict):
        return ""
    error = doc.get("error")
    for found in (doc.get("message"), error, error.get("message") if isinstance(error, dict) else None):
        if isinstance(found, str) and found.strip():
            return found
    return ""


class Sender:
    """Sends a Request to one server, REST or gRPC, and reads what comes back as a Reply."""

    def __init__(self, ts: TorchServe, timeout_s: float = TIMEOUT_S) -> None:
        self.ts, self.timeout_s = ts, timeout_s
        self.grpc = GrpcClient(ts.grpc_target, ts.tokens.inference, timeout_s)

    def close(self) -> None:
        self.grpc.close()

    def send(self, request: Request, timeout_s: Optional[float] = None) -> Reply:
        timeout_s = timeout_s or self.timeout_s
        if request.path.startswith(GRPC):
            return self._grpc(request, timeout_s)
        headers = {"Authorization": f"Bearer {self.ts.tokens.inference}", **dict(request.headers)}
        if request.content_type is not None:
            headers["Content-Type"] = request.content_type
        if request.strict:
            return self._strict(request, headers, timeout_s)
        try:  # a new connection each time: a reply that breaks HTTP framing cannot spill into the next
            resp = requests.post(f"{self.ts.inference_url}{request.path}", data=request.body, headers=headers,
                                 timeout=(5, timeout_s))
        except requests.RequestException as exc:
            return Reply(0, b"", "", f"no valid HTTP reply within {timeout_s:.0f} s: {type(exc).__name__}: {exc}"[:400])
        return Reply(resp.status_code, resp.content, body_message(resp.content),
                     headers={k.lower(): v for k, v in resp.headers.items()})

    def _strict(self, request: Request, headers: dict, timeout_s: float) -> Reply:
        try:
            status, found, body = raw_http.exchange(self.ts.inference_url, request.path, request.body, headers, timeout_s)
        except (raw_http.MalformedReply, OSError) as err:
            return Reply(0, b"", "", f"no valid HTTP reply: {type(err).__name__}: {err}"[:400])
        return Reply(status, body, body_message(body), headers=found)

    def _grpc(self, request: Request, timeout_s: float) -> Reply:
        method, model = request.path[len(GRPC):].split("/", 1)
        try:
            if method == "Predictions":
                chunks = [self.grpc.predict(model, request.body, raw=True, timeout_s=timeout_s)]
            else:
                chunks = list(self.grpc.stream_predict(model, request.body, raw=True, any_body=True, timeout_s=timeout_s))
        except grpc.RpcError as err:
            code = err.code()
            if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
                return Reply(0, b"", "", f"gRPC {method}: {code.name} (no answer within {timeout_s:.0f} s)")
            if code is grpc.StatusCode.UNIMPLEMENTED:
                status = 405 if method == "StreamPredictions" else 501
            else:
                status = _GRPC_STATUS.get(code, 500)
            return Reply(status, b"", error_message(err), f"gRPC {code.name}")
        refused = next((r for r in map(refusal, chunks) if r is not None), None)
        if refused is not None:
            return Reply(refused.status, refused.body, refused.message)
        return Reply(200, b"".join(chunks), "")

    def together(self, requests_: Sequence[Request]) -> list[Reply]:
        """All at once: a barrier releases every thread together, so that they share a batch."""
        barrier = threading.Barrier(len(requests_))

        def go(request: Request) -> Reply:
            barrier.wait(timeout=30)
            return self.send(request)

        with ThreadPoolExecutor(max_workers=len(requests_)) as pool:
            return list(pool.map(go, requests_))


def problems(reply: Reply, expect: Expect, judge: Judge) -> list[str]:
    """What breaks the contract in this reply, or nothing."""
    if reply.status == 0:
        return [reply.problem]
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


class Witness:
    """Proves that a test's batch-mates shared batches (no-op base)."""

    def start(self) -> None: ...

    def sent(self) -> None: ...

    def verify(self) -> None: ...


class Batches(Witness):
    """The handler's HandlerBatches{BatchSize} counter: each group's batch-mates (`least` items at
    least) formed one batch; a few groups may have been split by scheduling on a busy machine."""

    def __init__(self, ts: TorchServe, model: str, least: int) -> None:
        self.ts, self.model, self.least, self.groups, self.before = ts, model, least, 0, {}

    def start(self) -> None:
        self.before, self.groups = formed_batches(self.ts, self.model), 0

    def sent(self) -> None:
        self.groups += 1

    def verify(self) -> None:
        new = batches_since(self.ts, self.model, self.before, items=self.groups * (self.least + 1))
        together = sum(n for size, n in new.items() if size >= self.least)
        assert together >= max(1, self.groups - self.groups // 5), (
            f"{self.model}: {self.groups} groups sent, only {together} batches of {self.least}+ items formed "
            f"({new}): the batch-mates did not share batches")


class RunningPeak(Witness):
    """A generating model: GenerationPeakRunningSequences (sequences one step advanced together)
    read while the test runs; at least two ran together."""

    def __init__(self, ts: TorchServe, model: str) -> None:
        self.ts, self.model, self.peak = ts, model, 0.0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _read(self) -> None:
        try:
            self.peak = max(self.peak, Scrape.of(self.ts.metrics_text()).total("GenerationPeakRunningSequences", self.model))
        except (requests.RequestException, ValueError):
            pass

    def start(self) -> None:
        def loop():
            while not self._stop.wait(0.25):
                self._read()

        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()

    def verify(self) -> None:
        settled = time.monotonic() + 3.0  # the engine loop reports about once a second
        while self.peak < 2 and time.monotonic() < settled:
            time.sleep(0.25)
        self._stop.set()
        assert self.peak >= 2, f"{self.model}: no two sequences ever generated together (peak {self.peak})"

    def stop(self) -> None:
        self._stop.set()


class Contract:
    """One model's contract. Use as a context manager around the hypothesis run: on entry the model
    answers `canary` (or gets a fresh worker: a previous test's failure must not cascade), on a
    clean exit the witness verifies the batching. Each probe goes out with `mates()` (built on first
    use, after the canary: their references are answers alone), the first of which is then sent
    again as the next request."""

    def __init__(self, sender: Sender, model: str, canary: Request, mates: Callable[[], Sequence[Mate]],
                 witness: Witness) -> None:
        self.sender, self.ts, self.model = sender, sender.ts, model
        self.canary, self.mates, self.witness = canary, mates, witness

    def __enter__(self) -> Contract:
        self.ready_pids()
        if self.sender.send(self.canary, CANARY_TIMEOUT_S).status != 200:
            print(f"[hostile] {self.model} answers nothing: starting a fresh worker", file=sys.stderr, flush=True)
            self.ts.scale_workers(self.model, 0)
            self.ts.scale_workers(self.model, 1)
            self.ready_pids()
        self.witness.start()
        return self

    def __exit__(self, kind, *_) -> None:
        if kind is None:
            self.witness.verify()
        elif isinstance(self.witness, RunningPeak):
            self.witness.stop()

    def ready_pids(self) -> tuple[int, ...]:
        """The model's worker pids once every worker is READY (a restarting one is waited for)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            workers = self.ts.describe(self.model)["workers"]
            if workers and all(w.get("status") == "READY" and w.get("pid", -1) > 0 for w in workers):
                return tuple(sorted(int(w["pid"]) for w in workers))
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.model}: workers not READY after {READY_TIMEOUT_S:.0f} s: {workers}")
            time.sleep(0.5)

    def hold(self, probe: Probe) -> None:
        mates = list(self.mates())
        pids = self.ready_pids()
        replies = self.sender.together([probe.request, *(m.request for m in mates)])
        found = [f"the hostile request: {p}" for p in problems(replies[0], probe.expect, probe.judge)]
        for i, (mate, reply) in enumerate(zip(mates, replies[1:])):
            found += [f"batch-mate {i} ({mate.request.path}): {p}" for p in problems(reply, Expect(ANSWER), mate.judge)]
        now = tuple(sorted(self.ts.worker_pids(self.model)))
        if now != pids:
            found.append(f"worker pids {pids} -> {now}: the worker died")
        after = mates[0]  # once the contract is broken, the next request only says whether the model still answers
        reply = self.sender.send(after.request, CANARY_TIMEOUT_S if found else None)
        found += [f"the next request: {p}" for p in problems(reply, Expect(ANSWER), after.judge)]
        self.witness.sent()
        if found:
            raise AssertionError("\n".join([f"{self.model}: {probe.label} (expected {probe.expect!r})",
                                            f"  sent {probe.request!r}", *(f"  - {p}" for p in found)]))
