"""The bad-input corpus (benchmarks/reliability/corpus) against a real TorchServe.

Every invalid case must get a 4xx with a message, every valid one a 200 with a well-formed answer.
Each invalid case the handler must refuse goes out together with valid batch-mates (released at
once, so the frontend batches them): those must still get their 200. Afterwards no worker may
have restarted: the same PIDs, and no worker death in the logs.

    python -m benchmarks.reliability.badinput          # starts its own server from config.properties
"""

from __future__ import annotations

import argparse
import itertools
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import MappingProxyType
from typing import List, Optional, Sequence, Tuple

import requests

from benchmarks.load.traffic import Traffic, say
from benchmarks.reliability.corpus import FRONTEND, HANDLER, IMAGE_MODEL, TEXT_MODEL, Case, cases
from benchmarks.serving import ts_logs
from benchmarks.serving.launcher import TorchServe
from benchmarks.serving.repo import MODEL_STORE
from benchmarks.serving.server_metrics import BATCHES, Scrape

CATCH_ALL = "unexpected error decoding"  # handlers/base.py: an input no check foresaw
MODELS = (IMAGE_MODEL, TEXT_MODEL)
TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Outcome:
    case: Case
    status: int  # 0: no answer
    message: str
    well_formed: bool  # a valid case's answer has the model's shape

    @property
    def correct(self) -> bool:
        return self.case.outcome_ok(self.status, self.message) and (self.well_formed or not self.case.valid)

    def describe(self) -> str:
        return f"{self.case.model}: {self.case.name}: expected {self.case.expected}, got {self.status} {self.message[:100]!r}"


@dataclass(frozen=True)
class CorpusResult:
    outcomes: Tuple[Outcome, ...]
    batchmates: Tuple[Outcome, ...]  # the valid requests sent in the same batch as invalid ones
    mixed_batches: int  # batches that held 2+ accepted requests while the corpus ran
    restarted_workers: Tuple[str, ...]  # "model: old pids -> new pids"
    log_problems: Tuple[str, ...]
    traffic: Traffic  # every request (valid cases go several times, as batch-mates)

    @property
    def tried(self) -> int:
        return len(self.outcomes)

    @property
    def rejected_correctly(self) -> int:
        return sum(1 for o in self.outcomes if not o.case.valid and o.correct)

    @property
    def accepted_correctly(self) -> int:
        return sum(1 for o in self.outcomes if o.case.valid and o.correct)

    @property
    def problems(self) -> Tuple[str, ...]:
        out = [o.describe() for o in self.outcomes if not o.correct]
        out += [f"batch-mate of an invalid request failed: {o.describe()}" for o in self.batchmates if not o.correct]
        if self.mixed_batches == 0:
            out.append("no batch held two accepted requests: batch-mates were never tested together")
        out += [f"worker restarted: {r}" for r in self.restarted_workers]
        return tuple(out) + self.log_problems

    @property
    def passed(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        invalid = sum(1 for o in self.outcomes if not o.case.valid)
        good = sum(1 for o in self.batchmates if o.correct)
        return (f"corpus: {self.tried} inputs, {self.rejected_correctly}/{invalid} invalid rejected correctly, "
                f"{self.accepted_correctly}/{self.tried - invalid} valid accepted correctly; "
                f"batch-mates {good}/{len(self.batchmates)} ok in {self.mixed_batches} mixed batches; "
                f"worker restarts: {len(self.restarted_workers)}")


def well_formed(model: str, response: requests.Response) -> bool:
    try:
        answer = response.json()
    except ValueError:
        return False
    if model == IMAGE_MODEL:
        return isinstance(answer, dict) and len(answer) == 5 and all(0 <= p <= 1 for p in answer.values())
    return isinstance(answer, dict) and len(answer.get("embedding", ())) == 384


def send(ts: TorchServe, case: Case) -> Outcome:
    headers = {"Authorization": f"Bearer {ts.tokens.inference}"}
    if case.content_type is not None:  # None: no Content-Type header at all
        headers["Content-Type"] = case.content_type
    try:
        response = requests.post(f"{ts.inference_url}/predictions/{case.model}", data=case.body, headers=headers,
                                 timeout=TIMEOUT_S)
    except requests.RequestException as exc:
        return Outcome(case, 0, f"no answer: {type(exc).__name__}", False)
    message = ""
    if response.status_code != 200:
        try:
            message = str(response.json().get("message", ""))
        except (ValueError, AttributeError):
            message = ""
        message = message or response.reason or ""  # the frontend's 413 has no body, only its reason
    return Outcome(case, response.status_code, message,
                   response.status_code == 200 and well_formed(case.model, response))


def send_together(ts: TorchServe, groups: Sequence[Sequence[Case]]) -> List[List[Outcome]]:
    """Every request of every group at once (a barrier releases them together): the frontend
    batches requests that arrive together, so each group's requests share batches."""
    flat = [case for group in groups for case in group]
    barrier = threading.Barrier(len(flat))

    def go(case: Case) -> Outcome:
        barrier.wait(timeout=30)
        return send(ts, case)

    with ThreadPoolExecutor(max_workers=len(flat)) as pool:
        answers = iter(list(pool.map(go, flat)))
    return [[next(answers) for _ in group] for group in groups]


def formed_batches(ts: TorchServe) -> int:
    """Batches of 2+ accepted requests so far, over both models (handlers' HandlerBatches counter)."""
    scrape = Scrape.of(ts.metrics_text())
    return int(sum(n for m in MODELS for size, n in scrape.by_label(BATCHES, m, "BatchSize").items()
                   if int(size) >= 2))


def mixed_groups(corpus: Sequence[Case], model: str, per_group: int) -> List[List[Case]]:
    """Groups of `per_group` invalid + `per_group` valid cases, until every case went at least once
    (valid ones cycle: they are the batch-mates)."""
    mine = [c for c in corpus if c.model == model and c.layer == HANDLER]
    invalid = [c for c in mine if not c.valid]
    valid = [c for c in mine if c.valid]
    count = max(-(-len(invalid) // per_group), -(-len(valid) // per_group))
    mates = itertools.cycle(valid)
    return [invalid[k * per_group:(k + 1) * per_group] + [next(mates) for _ in range(per_group)]
            for k in range(count)]


def run_corpus(ts: TorchServe, per_group: int = 2, groups_at_once: int = 2) -> CorpusResult:
    """Send the whole corpus: groups of `per_group` invalid + `per_group` valid requests,
    `groups_at_once` groups released together (at most batchSize requests in all)."""
    pids = {m: ts.worker_pids(m) for m in MODELS}
    log_marks = {name: len(ts.log_text(name)) for name in ("ts_log.log", "model_log.log")}
    max_request = int(ts.config.get("max_request_size", "6553500") or 6553500)
    corpus = cases(max_request)
    batches_before = formed_batches(ts)
    by_case: dict = {}
    mates: List[Outcome] = []
    for model in MODELS:
        at_once = max(1, min(groups_at_once, int(ts.describe(model)["batchSize"]) // (2 * per_group)))
        groups = mixed_groups(corpus, model, per_group)
        say(f"corpus {model}: {len(groups)} groups of up to {2 * per_group} requests, {at_once} at a time")
        for start in range(0, len(groups), at_once):
            chunk = groups[start:start + at_once]
            for group, answers in zip(chunk, send_together(ts, chunk)):
                mixed = any(not c.valid for c in group)
                for case, outcome in zip(group, answers):
                    by_case.setdefault(case, []).append(outcome)
                    if case.valid and mixed:
                        mates.append(outcome)
    frontend = [c for c in corpus if c.layer == FRONTEND]
    say(f"corpus: {len(frontend)} requests the frontend itself must refuse")
    for case in frontend:
        by_case[case] = [send(ts, case)]
    # One outcome per case: its first wrong answer if any.
    outcomes = tuple(next((o for o in by_case[c] if not o.correct), by_case[c][0]) for c in corpus)
    restarted = tuple(f"{m}: {pids[m]} -> {ts.worker_pids(m)}" for m in MODELS if ts.worker_pids(m) != pids[m])
    every = [o for answers in by_case.values() for o in answers]
    errors: dict = {}
    for o in every:
        if o.status not in (0, 200):
            errors[str(o.status)] = errors.get(str(o.status), 0) + 1
    traffic = Traffic(len(every), sum(1 for o in every if o.status), sum(1 for o in every if o.status == 200),
                      MappingProxyType(dict(sorted(errors.items()))))
    return CorpusResult(outcomes, tuple(mates), formed_batches(ts) - batches_before, restarted,
                        log_problems(ts, log_marks), traffic)


def log_problems(ts: TorchServe, since: dict) -> Tuple[str, ...]:
    out = []
    for name, start in since.items():
        for line in ts.log_text(name)[start:].splitlines():
            if ts_logs.WORKER_DEATH.search(line):
                out.append(f"logs/{name}: {line.strip()[:200]}")
            elif CATCH_ALL in line:
                out.append(f"an input reached the handlers' catch-all: logs/{name}: {line.strip()[:200]}")
    return tuple(dict.fromkeys(out))  # TorchServe logs some lines twice


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-store", default=str(MODEL_STORE))
    args = parser.parse_args(argv)
    with TorchServe(args.model_store, wait_for=MODELS) as ts:
        result = run_corpus(ts)
    print(result.summary())
    for problem in result.problems:
        print(f"  FAIL {problem}")
    return 0 if result.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
