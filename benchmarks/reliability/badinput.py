"""The bad-input corpus (each family's cases, benchmarks/reliability/corpus.py) against a real TorchServe.

Every invalid case must get a 4xx with a message, every valid one a 200 with a well-formed answer.
Each invalid case the handler must refuse goes out together with valid batch-mates (released at
once, so the frontend batches them): those must still get their 200. Afterwards no worker may
have restarted: the same PIDs, and no worker death in the logs.

    python -m benchmarks bad-input         # starts its own server from config.properties
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import MappingProxyType
from typing import Optional

import requests

from benchmarks.load import cli
from benchmarks.load.server_metrics import BATCHES, Scrape
from benchmarks.load.traffic import Traffic, say
from benchmarks.reliability.corpus import FRONTEND, HANDLER, Case, family_cases, server_cases
from build.catalogue import Catalogue
from build.export import served_settings
from handlers.families import family_class
from handlers.settings import HandlerSettings
from serving import ts_logs
from serving.launcher import TorchServe
from serving.repo import CATALOGUE

CATCH_ALL = "unexpected error decoding"  # handlers/handler.py: an input no check foresaw
TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Outcome:
    model: str
    case: Case
    status: int  # 0: no answer
    message: str
    well_formed: bool  # a valid case's answer has the model's shape

    @property
    def correct(self) -> bool:
        return self.case.outcome_ok(self.status, self.message) and (self.well_formed or not self.case.valid)

    def describe(self) -> str:
        return (f"{self.model}: {self.case.name}: expected {self.case.expected}, got {self.status} "
                f"{self.message[:100]!r}")


@dataclass(frozen=True)
class CorpusResult(cli.Checked):
    outcomes: tuple[Outcome, ...]
    batchmates: tuple[Outcome, ...]  # the valid requests sent in the same batch as invalid ones
    mixed_batches: int  # batches that held 2+ accepted requests while the corpus ran
    restarted_workers: tuple[str, ...]  # "model: old pids -> new pids"
    log_problems: tuple[str, ...]
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
    def problems(self) -> tuple[str, ...]:
        out = [o.describe() for o in self.outcomes if not o.correct]
        out += [f"batch-mate of an invalid request failed: {o.describe()}" for o in self.batchmates if not o.correct]
        if self.mixed_batches == 0:
            out.append("no batch held two accepted requests: batch-mates were never tested together")
        out += [f"worker restarted: {r}" for r in self.restarted_workers]
        return tuple(out) + self.log_problems

    def summary(self) -> str:
        invalid = sum(1 for o in self.outcomes if not o.case.valid)
        good = sum(1 for o in self.batchmates if o.correct)
        return (f"corpus: {self.tried} inputs, {self.rejected_correctly}/{invalid} invalid rejected correctly, "
                f"{self.accepted_correctly}/{self.tried - invalid} valid accepted correctly; "
                f"batch-mates {good}/{len(self.batchmates)} ok in {self.mixed_batches} mixed batches; "
                f"worker restarts: {len(self.restarted_workers)}")


def served_models(ts: TorchServe) -> dict[str, HandlerSettings]:
    """Each model the server runs that the catalogue knows, with the settings its archive runs."""
    catalogue = Catalogue.load(CATALOGUE)
    return {m: served_settings(catalogue.entry(m)) for m in ts.list_models() if m in catalogue.names}


def answer_problem(settings: HandlerSettings, response: requests.Response) -> Optional[str]:
    """What is wrong with a 200's answer for the model's family, or None (a streamed NDJSON answer
    is judged by its last line, which carries the summary)."""
    try:
        answer = response.json()
    except ValueError:
        lines = [line for line in response.content.splitlines() if line.strip()]
        try:
            answer = json.loads(lines[-1]) if lines else None
        except ValueError:
            return f"not JSON: {response.content[:80]!r}"
    return family_class(settings.family).answer_problem(settings.family_settings, answer)


def well_formed(settings: HandlerSettings, response: requests.Response) -> bool:
    return answer_problem(settings, response) is None


def send(ts: TorchServe, model: str, case: Case, settings: Optional[HandlerSettings] = None) -> Outcome:
    headers = {"Authorization": f"Bearer {ts.tokens.inference}"}
    if case.content_type is not None:  # None: no Content-Type header at all
        headers["Content-Type"] = case.content_type
    try:
        response = requests.post(f"{ts.inference_url}/predictions/{model}", data=case.body, headers=headers,
                                 timeout=TIMEOUT_S)
    except requests.RequestException as exc:
        return Outcome(model, case, 0, f"no answer: {type(exc).__name__}", False)
    message = ""
    if response.status_code != 200:
        try:
            message = str(response.json().get("message", ""))
        except (ValueError, AttributeError):
            message = ""
        message = message or response.reason or ""  # the frontend's 413 has no body, only its reason
    return Outcome(model, case, response.status_code, message,
                   response.status_code == 200 and settings is not None and well_formed(settings, response))


def send_together(ts: TorchServe, model: str, settings: HandlerSettings,
                  groups: Sequence[Sequence[Case]]) -> list[list[Outcome]]:
    """Every request of every group at once (a barrier releases them together): the frontend
    batches requests that arrive together, so each group's requests share batches."""
    flat = [case for group in groups for case in group]
    barrier = threading.Barrier(len(flat))

    def go(case: Case) -> Outcome:
        barrier.wait(timeout=30)
        return send(ts, model, case, settings)

    with ThreadPoolExecutor(max_workers=len(flat)) as pool:
        answers = iter(list(pool.map(go, flat)))
    return [[next(answers) for _ in group] for group in groups]


def formed_batches(ts: TorchServe, models: Sequence[str]) -> int:
    """Batches of 2+ accepted requests so far, over these models (handlers' HandlerBatches counter)."""
    scrape = Scrape.of(ts.metrics_text())
    return int(sum(n for m in models for size, n in scrape.by_label(BATCHES, m, "BatchSize").items()
                   if int(size) >= 2))


def mixed_groups(corpus: Sequence[Case], per_group: int) -> list[list[Case]]:
    """Groups of `per_group` invalid + `per_group` valid cases, until every case went at least once
    (valid ones cycle: they are the batch-mates)."""
    mine = [c for c in corpus if c.layer == HANDLER]
    invalid = [c for c in mine if not c.valid]
    valid = [c for c in mine if c.valid]
    count = max(-(-len(invalid) // per_group), -(-len(valid) // per_group))
    mates = itertools.cycle(valid)
    return [invalid[k * per_group:(k + 1) * per_group] + [next(mates) for _ in range(per_group)]
            for k in range(count)]


def run_corpus(ts: TorchServe, per_group: int = 2, groups_at_once: int = 2) -> CorpusResult:
    """Send each served model its family's corpus: groups of `per_group` invalid + `per_group`
    valid requests, `groups_at_once` groups released together (at most batchSize requests in all);
    then the bodies its limits refuse, and two requests no model may answer."""
    served = served_models(ts)
    pids = {m: ts.worker_pids(m) for m in served}
    log_marks = {name: len(ts.log_text(name)) for name in ("ts_log.log", "model_log.log")}
    max_request = int(ts.config.get("max_request_size", "6553500") or 6553500)
    batches_before = formed_batches(ts, list(served))
    by_case: dict = {}
    mates: list[Outcome] = []
    for model, settings in served.items():
        corpus = family_cases(settings.family, settings.family_settings)
        at_once = max(1, min(groups_at_once, int(ts.describe(model)["batchSize"]) // (2 * per_group)))
        groups = mixed_groups(corpus, per_group)
        say(f"corpus {model} ({settings.family}): {len(groups)} groups of up to {2 * per_group} requests, "
            f"{at_once} at a time")
        for start in range(0, len(groups), at_once):
            chunk = groups[start:start + at_once]
            for group, answers in zip(chunk, send_together(ts, model, settings, chunk)):
                mixed = any(not c.valid for c in group)
                for case, outcome in zip(group, answers):
                    by_case.setdefault((model, case), []).append(outcome)
                    if case.valid and mixed:
                        mates.append(outcome)
        limit = getattr(settings.family_settings, "max_body_bytes", None)
        for case in server_cases(settings.family, max_request, limit):
            by_case[(model, case)] = [send(ts, model, case, settings)]
    for model, case in nowhere_cases():
        by_case[(model, case)] = [send(ts, model, case)]
    # One outcome per case: its first wrong answer if any.
    outcomes = tuple(next((o for o in answers if not o.correct), answers[0]) for answers in by_case.values())
    restarted = tuple(f"{m}: {pids[m]} -> {ts.worker_pids(m)}" for m in served if ts.worker_pids(m) != pids[m])
    every = [o for answers in by_case.values() for o in answers]
    errors: dict = {}
    for o in every:
        if o.status not in (0, 200):
            errors[str(o.status)] = errors.get(str(o.status), 0) + 1
    traffic = Traffic(len(every), sum(1 for o in every if o.status), sum(1 for o in every if o.status == 200),
                      MappingProxyType(dict(sorted(errors.items()))))
    return CorpusResult(outcomes, tuple(mates), formed_batches(ts, list(served)) - batches_before, restarted,
                        log_problems(ts, log_marks), traffic)


def nowhere_cases() -> list[tuple[str, Case]]:
    """Requests for models that do not exist: the frontend's 404, whatever is served."""
    return [("no_such_model", Case("unknown model", "-", b"hello", "text/plain", False, 404, "", FRONTEND)),
            ("..%2f..%2fetc%2fpasswd", Case("model name with path traversal", "-", b"hello", "text/plain", False,
                                            None, "", FRONTEND))]


def log_problems(ts: TorchServe, since: dict) -> tuple[str, ...]:
    out = []
    for name, start in since.items():
        for line in ts.log_text(name)[start:].splitlines():
            if ts_logs.WORKER_DEATH.search(line):
                out.append(f"logs/{name}: {line.strip()[:200]}")
            elif CATCH_ALL in line:
                out.append(f"an input reached the handlers' catch-all: logs/{name}: {line.strip()[:200]}")
    return tuple(dict.fromkeys(out))  # TorchServe logs some lines twice


def main(argv: Sequence[str]) -> int:
    p = cli.parser("bad-input", __doc__.split("\n\n")[0])
    cli.add(p, "model_store")
    args = p.parse_args(argv)
    with TorchServe(args.model_store) as ts:
        return cli.verdict(run_corpus(ts))
