"""Injected faults: a worker killed under load, and archives that cannot load.

1. SIGKILL a model's worker while clients keep sending. TorchServe answers the batch the worker
   held with an error (507 "Worker died."), queues the rest, and starts a new worker; on Ray Serve
   the replica's controller starts a new replica. Checked:
   every request sent gets an HTTP answer within its timeout (none hangs or vanishes), every
   request sent after the new worker is READY succeeds, and the recovery time (kill -> READY).
2. Register broken archives (weights missing, a truncated .mar, handler settings with a typo) on a
   server whose model API is on (only this test server; the shipped config keeps it off): each is
   refused by the management API with an error status and message, the logs say why, and the
   healthy model keeps answering 200 throughout.

    python -m benchmarks faults            # starts its own servers through the launcher
"""

from __future__ import annotations

import json
import os
import re
import signal
import tempfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from benchmarks.load import cli
from benchmarks.load.errors import BenchmarkError
from benchmarks.load.traffic import (
    ClosedLoop,
    Traffic,
    others_meter,
    payloads,
    say,
    target,
)
from serving.launcher import TorchServe
from serving.ray.launcher import RayServe

RECOVERY_LIMIT_S = 180.0
_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT")


@dataclass(frozen=True)
class KillResult(cli.Checked):
    model: str
    killed_pid: int
    new_pids: tuple[int, ...]
    recovery_s: Optional[float]  # SIGKILL -> a new worker READY; None: never within the limit
    first_ok_after_kill_s: Optional[float]  # SIGKILL -> the next successful answer
    traffic: Traffic
    failed_after_recovery: int  # requests sent once the new worker was READY that did not succeed
    others_cpu_pct: float = 0.0  # CPU other processes on the machine used meanwhile (% of one core)

    @property
    def problems(self) -> tuple[str, ...]:
        out = []
        if self.recovery_s is None:
            out.append(f"{self.model}: no READY worker {RECOVERY_LIMIT_S:.0f} s after the kill")
        if self.killed_pid in self.new_pids:
            out.append(f"{self.model}: the killed pid {self.killed_pid} is still listed")
        if self.traffic.lost:
            out.append(f"{self.model}: {self.traffic.lost} requests got no answer within their timeout")
        if self.failed_after_recovery:
            out.append(f"{self.model}: {self.failed_after_recovery} requests failed after recovery")
        return tuple(out)

    def summary(self) -> str:
        rec = "never" if self.recovery_s is None else f"{self.recovery_s:.1f} s"
        first = "never" if self.first_ok_after_kill_s is None else f"{self.first_ok_after_kill_s:.1f} s"
        return (f"SIGKILL {self.model} worker {self.killed_pid}: READY again after {rec}, first success "
                f"after {first}; {self.traffic.describe()}; {self.failed_after_recovery} failed after recovery; "
                f"other processes used {self.others_cpu_pct:.0f}% CPU meanwhile")


def _ready_replacement(ts: TorchServe | RayServe, model: str, before: tuple[int, ...], killed: int) -> tuple[int, ...]:
    """The worker pids once the killed one is gone and a new pid brought the READY count back to
    what it was before the kill (with several workers a sibling is READY all along); else ()."""
    listed = set(ts.worker_pids(model))
    ready = set(ts.ready_worker_pids(model))
    if killed not in listed and ready - set(before) and len(ready) >= len(before):
        return tuple(sorted(listed))
    return ()


def kill_worker_under_load(ts: TorchServe | RayServe, model: str, concurrency: int = 4, before_s: float = 3.0,
                           after_s: float = 5.0, timeout_s: float = 60.0) -> KillResult:
    """SIGKILL the model's first worker (TorchServe's worker, Ray Serve's replica) `before_s` into a
    closed-loop load; keep the load on until `after_s` after the replacement is READY."""
    before = tuple(ts.worker_pids(model))
    victim = before[0]
    others = others_meter(ts)
    with ClosedLoop(target(ts, model, timeout_s), payloads(model), concurrency,
                    max_seconds=before_s + RECOVERY_LIMIT_S + after_s + 5) as load:
        time.sleep(before_s)
        killed_at = time.perf_counter()
        say(f"SIGKILL {model} worker {victim} under {concurrency} clients")
        os.kill(victim, signal.SIGKILL)
        recovered_at, pids = None, ()
        while time.perf_counter() - killed_at < RECOVERY_LIMIT_S:
            pids = _ready_replacement(ts, model, before, victim)
            if pids:
                recovered_at = time.perf_counter()
                say(f"{model}: new worker READY after {recovered_at - killed_at:.1f} s (pids {pids})")
                break
            time.sleep(0.25)
        time.sleep(after_s)
        traffic = load.stop()
    samples = load.snapshot()
    first_ok = min((s.done for s in samples if s.ok and s.done > killed_at), default=None)
    late_failures = 0 if recovered_at is None else sum(1 for s in samples if s.sent >= recovered_at and not s.ok)
    return KillResult(model, victim, tuple(pids) or ts.worker_pids(model),
                      None if recovered_at is None else recovered_at - killed_at,
                      None if first_ok is None else first_ok - killed_at, traffic, late_failures, others())


# ---- archives that cannot load ----------------------------------------------------------------
@dataclass(frozen=True)
class BrokenArchive:
    name: str
    what: str
    log_cause: str  # regex: the logs must say this


def _rewrite(source: Path, dest: Path, name: str, drop: str = "", config_edit=None) -> None:
    """Copy an archive under a new model name, dropping a file or editing model-config.yaml."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(dest, "w") as out:
        for item in src.infolist():
            if item.filename == drop:
                continue
            data = src.read(item)
            if item.filename == "MAR-INF/MANIFEST.json":
                manifest = json.loads(data)
                manifest["model"]["modelName"] = name
                data = json.dumps(manifest).encode()
            elif item.filename == "model-config.yaml" and config_edit is not None:
                data = yaml.safe_dump(config_edit(yaml.safe_load(data))).encode()
            out.writestr(item, data)


def write_broken_archives(healthy: Path, store: Path) -> tuple[BrokenArchive, ...]:
    """Broken variants of a real archive, next to it in `store`."""
    with zipfile.ZipFile(healthy) as mar:
        weights = yaml.safe_load(mar.read("model-config.yaml"))["handler"]["weights"]

    def typo(config):
        config["handler"]["runtime"]["threadz"] = 2
        return config

    _rewrite(healthy, store / "no_weights.mar", "no_weights", drop=weights)
    _rewrite(healthy, store / "bad_settings.mar", "bad_settings", config_edit=typo)
    (store / "truncated.mar").write_bytes(healthy.read_bytes()[:4096])
    return (
        BrokenArchive("no_weights", f"weights file {weights} missing", rf"{re.escape(weights)} does not exist"),
        BrokenArchive("bad_settings", "unknown key in the handler settings", r"unknown key 'threadz'"),
        BrokenArchive("truncated", "archive cut at 4 KB", r"Failed to load model: truncated\.mar"),
    )


@dataclass(frozen=True)
class LoadFailure:
    archive: BrokenArchive
    api_status: int
    api_message: str
    still_registered: bool
    log_line: str  # the log line that names the cause ("" if none)

    @property
    def problems(self) -> tuple[str, ...]:
        out = []
        if self.api_status < 400 or not self.api_message:
            out.append(f"{self.archive.name}: registration answered {self.api_status} {self.api_message!r}")
        if self.still_registered:
            out.append(f"{self.archive.name}: left registered after failing to load")
        if not self.log_line:
            out.append(f"{self.archive.name}: no log line matching {self.archive.log_cause!r}")
        return tuple(out)


@dataclass(frozen=True)
class BrokenArchivesResult(cli.Checked):
    healthy_model: str
    failures: tuple[LoadFailure, ...]
    traffic: Traffic  # the healthy model's, throughout

    @property
    def problems(self) -> tuple[str, ...]:
        out = [p for f in self.failures for p in f.problems]
        if self.traffic.ok != self.traffic.sent or not self.traffic.sent:
            out.append(f"{self.healthy_model} did not keep serving: {self.traffic.describe()}")
        return tuple(out)

    def summary(self) -> str:
        parts = [f"{f.archive.name} ({f.archive.what}) -> {f.api_status} {f.api_message!r}, log: {f.log_line[-120:]!r}"
                 for f in self.failures]
        return (f"broken archives: {'; '.join(parts)}. {self.healthy_model} meanwhile: "
                f"{self.traffic.describe()}")


def broken_archives(model_store: Path, healthy_model: str) -> BrokenArchivesResult:
    """A server with the model API on (this fault test only) and one healthy model; each broken
    archive is registered while the healthy model is under a light load."""
    with tempfile.TemporaryDirectory(prefix="broken-store-") as tmp:
        store = Path(tmp)
        healthy = Path(model_store) / f"{healthy_model}.mar"
        if not healthy.is_file():
            raise BenchmarkError(f"{healthy} missing: build it first (.venv/bin/python -m build)")
        os.symlink(healthy.resolve(), store / healthy.name)
        broken = write_broken_archives(healthy, store)
        # The truncated archive fails at start-up (the frontend cannot unzip it: only then does it
        # log why); the others are registered through the API, which answers why they failed.
        props = {"enable_model_api": "true", "load_models": f"{healthy.name},truncated.mar"}
        with TorchServe(store, extra_properties=props, wait_for=(healthy_model,)) as ts:
            with ClosedLoop(target(ts, healthy_model), payloads(healthy_model), 1, max_seconds=600) as load:
                failures = tuple(_register(ts, archive) for archive in broken)
                time.sleep(1.0)
                traffic = load.stop()
    return BrokenArchivesResult(healthy_model, failures, traffic)


def _register(ts: TorchServe, archive: BrokenArchive) -> LoadFailure:
    say(f"registering {archive.name}.mar ({archive.what})")
    resp = ts.client.management("POST", "/models", params={"url": f"{archive.name}.mar", "initial_workers": 1,
                                                           "synchronous": "true"}, timeout=RECOVERY_LIMIT_S)
    try:
        message = str(resp.json().get("message", ""))
    except ValueError:
        message = resp.text[:200]
    registered = ts.client.management("GET", f"/models/{archive.name}", timeout=30).status_code == 200
    cause = re.compile(archive.log_cause)
    logs = ts.log_text("ts_log.log") + ts.log_text("model_log.log")
    # Reports are committed: the server's temp folder is no path of ours to keep.
    logs = logs.replace(str(ts.workdir / "tmp"), "<server tmp>").replace(str(ts.workdir), "<server dir>")
    lines = logs.splitlines()
    at = next((i for i, ln in enumerate(lines) if cause.search(ln)), None)
    line = "" if at is None else lines[at].strip()[:240]
    if at is not None and at + 1 < len(lines) and not _TIMESTAMP.match(lines[at + 1]):
        line += " | " + lines[at + 1].strip()[:160]  # the exception TorchServe logs under a failed load
    return LoadFailure(archive, resp.status_code, message, registered, line)


def main(argv: Sequence[str]) -> int:
    p = cli.parser("faults", __doc__.split("\n\n")[0])
    cli.add(p, "model", "model_store")
    p.add_argument("--concurrency", type=int, default=8, help="clients while the worker is killed")
    args = p.parse_args(argv)
    model = cli.model_or_first(args.model)
    with TorchServe(args.model_store, load=(model,)) as ts:
        killed = kill_worker_under_load(ts, model, args.concurrency)
    return cli.verdict(killed, broken_archives(Path(args.model_store), model))
