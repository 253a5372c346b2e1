"""`make reliability`: every reliability and security check against real servers, then one table.

Three servers, each through the launcher (temp dir, free loopback ports, always stopped):
1. the shipped config.properties with every model (plus the soak's JVM heap settings, see
   benchmarks/reliability/soak.py): security checks, the soak (short by default), the bad-input corpus
   (each model gets its family's cases), a worker SIGKILLed under load, the secrets scan;
2. one model (--model, default the catalogue's first) on a small job queue (job_queue_size written
   into that server's config): overload at 3x its measured capacity;
3. that model on the shipped job queue (100): 2x its capacity without deadlines, then with a budget of
   2x its SLO on every request (benchmarks/reliability/deadlines.py);
4. the model API on (this fault test server only): broken archives next to that model, healthy.
The figures go to benchmarks/reports/reliability-<time>/ (summary.json, table.txt, soak.png,
deadlines/).

    python -m benchmarks reliability [--soak-minutes 1] [--overload-seconds 15] [--deadline-seconds 20]
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.load import cli
from benchmarks.load.errors import BenchmarkError
from benchmarks.load.traffic import capacity, say
from benchmarks.reliability import badinput, deadlines, faults, overload, security, soak
from benchmarks.reliability.findings import Findings, table
from serving.errors import LauncherError
from serving.launcher import TorchServe


def attempt(errors: list[str], name: str, step: Callable):
    """Run one check; a check that cannot run is recorded, and the others still run."""
    try:
        return step()
    except (LauncherError, BenchmarkError, OSError) as exc:  # OSError: requests' errors too
        say(f"{name} could not run: {exc}")
        errors.append(f"{name}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
        return None


def run(store: Path, out: Path, model: str, soak_minutes: float, overload_seconds: float,
        job_queue_size: int, deadline_seconds: float = 20.0) -> tuple[Findings, list[str]]:
    """All checks (the soak, kill, overload and broken-archive ones on `model`, the corpus on every
    model); also the servers' keys, to prove afterwards that no report holds one."""
    errors: list[str] = []
    checks: list[security.Check] = list(security.weights_checks())
    keys: list[str] = []
    corpus = kill = soaked = loaded = compared = None

    def main_server():
        nonlocal corpus, kill, soaked
        with TorchServe(store, extra_properties=soak.soak_vmargs()) as ts:
            keys.extend([ts.tokens.inference, ts.tokens.management, ts.tokens.api])
            checks.extend(security.server_checks(ts, model))
            # The soak first: it measures the steady state, not the aftermath of the faults below.
            soaked = attempt(errors, "soak", lambda: soak.soak(ts, model, soak_minutes, capacity(ts, model)))
            if soaked is not None:
                soak.write_report(soaked, out)
            corpus = attempt(errors, "bad-input corpus", lambda: badinput.run_corpus(ts))
            kill = attempt(errors, "worker SIGKILL", lambda: faults.kill_worker_under_load(ts, model, concurrency=8))
            checks.extend(security.secrets_checks(ts, extra=[out]))

    def overload_server():
        nonlocal loaded
        props = {"job_queue_size": str(job_queue_size), **soak.soak_vmargs()}  # pre-touched heap: RSS = footprint
        with TorchServe(store, load=(model,), extra_properties=props) as ts:
            keys.extend([ts.tokens.inference, ts.tokens.management, ts.tokens.api])
            loaded = overload.overload(ts, model, capacity(ts, model), 3.0, overload_seconds)
            checks.extend(security.secrets_checks(ts))

    def deadline_server():
        nonlocal compared
        props = {"job_queue_size": str(deadlines.JOB_QUEUE_SIZE), **soak.soak_vmargs()}
        with TorchServe(store, load=(model,), extra_properties=props) as ts:
            keys.extend([ts.tokens.inference, ts.tokens.management, ts.tokens.api])
            compared = deadlines.compare(ts, model, capacity(ts, model), 2.0, deadline_seconds)
        deadlines.write_report(compared, out / "deadlines", "make reliability")

    attempt(errors, "main server", main_server)
    attempt(errors, "overload", overload_server)
    if deadline_seconds > 0:
        attempt(errors, "overload with deadlines", deadline_server)
    archives = attempt(errors, "broken archives", lambda: faults.broken_archives(store, model))
    return Findings(corpus, kill, archives, loaded, soaked, compared, tuple(checks), tuple(errors)), keys


def write(findings: Findings, out: Path, keys: Sequence[str]) -> str:
    text = table(findings.rows())
    summaries = [r.summary() for r in (findings.corpus, findings.kill, findings.archives, findings.overload,
                                      findings.soak, findings.deadline_overload) if r is not None]
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.txt").write_text(text + "\n", encoding="utf-8")
    (out / "summary.json").write_text(json.dumps({
        "passed": findings.passed, "rows": [r.__dict__ for r in findings.rows()], "summaries": summaries,
        "security": [c.__dict__ for c in findings.checks], "problems": list(findings.problems),
    }, indent=2) + "\n", encoding="utf-8")
    leaked = [p.name for p in out.rglob("*") if p.is_file() and any(k and k.encode() in p.read_bytes() for k in keys)]
    if leaked:  # never expected: reports hold figures only
        raise LauncherError(f"a server token was written into {leaked}")
    return "\n".join(summaries) + "\n\n" + "\n".join(c.line() for c in findings.checks) + "\n\n" + text


def main(argv: Sequence[str]) -> int:
    p = cli.parser("reliability", __doc__.split("\n\n")[0])
    p.add_argument("--soak-minutes", type=float, default=1.0,
                   help="soak length (python -m benchmarks soak --minutes 10 for the long one)")
    p.add_argument("--overload-seconds", type=float, default=15.0)
    p.add_argument("--deadline-seconds", type=float, default=20.0,
                   help="each run of the overload with and without deadlines (0: skip it)")
    cli.add(p, "model_store", "out", job_queue_size={"default": 16, "help": "the overload server's job_queue_size"},
            model={"help": "the soak, kill, overload and broken-archive checks' model (default: the catalogue's "
                           "first); the corpus goes to every model"})
    args = p.parse_args(argv)
    out = cli.report_folder(args.out, "reliability")
    began = time.monotonic()
    findings, keys = run(args.model_store, out, cli.model_or_first(args.model), args.soak_minutes,
                         args.overload_seconds, args.job_queue_size, args.deadline_seconds)
    print(write(findings, out, keys))
    for problem in findings.problems:
        print(f"  FAIL {problem}")
    print(f"\n{'PASSED' if findings.passed else 'FAILED'} in {time.monotonic() - began:.0f} s; report: {out}")
    return 0 if findings.passed else 1
