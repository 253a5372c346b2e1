"""The tuned plan on Ray Serve: the tuner's search and judge, each candidate served by a Ray cluster,
the choice written into Ray Serve's own config file and verified by serving that file.

    python -m benchmarks tune-ray --model minilm --space tiny --budget-min 10
    make tune ENGINE=ray [MODEL=<name>] [ARGS="..."]

The same space, in-process fit, model-guided search, shortest-delay rule and report as `make tune`
(benchmarks/tune/pipeline.py, every option of `tune` but --mix), with the measurer swapped: each
candidate runs on a fresh Ray cluster (serving/ray/launcher.py) whose Serve config gives the
candidate's batch size -> max_batch_size, delay -> batch_wait_timeout_s, workers -> num_replicas,
threads -> num_cpus. config.properties is left alone. Then:
1. the chosen values go into --serve-config (default ./ray-serve.yaml, the file `serve deploy` and
   KubeRay's RayService take): the model's app replaced, the other models' apps kept;
2. verification: a cluster started from that file itself (every app in it deployed), one request
   per model answered 200; the result is ray.json in the tuner's report folder.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Optional

import yaml

from benchmarks.load import loadgen, resources, runner, server_metrics
from benchmarks.load.errors import BenchmarkError
from benchmarks.tune import command, report
from benchmarks.tune.errors import TuneError
from benchmarks.tune.measure import ServedMeasurer, ServePlan, point_from
from benchmarks.tune.pipeline import tune_model
from benchmarks.tune.results import Point
from benchmarks.tune.space import Candidate
from serving import processes
from serving.errors import LauncherError
from serving.ray import serve_config
from serving.ray.launcher import RayServe
from serving.repo import REPO_ROOT, shown
from serving.ts_config import ModelSettings

Progress = Callable[[str], None]
DEFAULT_SERVE_CONFIG = REPO_ROOT / "ray-serve.yaml"


class RayMeasurer(ServedMeasurer):
    """The tuner's measurer with a Ray cluster per candidate instead of a TorchServe."""

    def __init__(self, plan: ServePlan, progress: Progress = print, haproxy: bool = True) -> None:
        # --wait-quiet watches TorchServe's processes: not these
        super().__init__(replace(plan, wait_quiet_s=0.0), progress)
        self.haproxy = haproxy
        self._folder = Path(tempfile.mkdtemp(prefix="tune-ray-"))

    def __exit__(self, *exc: object) -> None:
        try:
            self.finish()
        finally:
            shutil.rmtree(self._folder, ignore_errors=True)

    def _start(self, candidate: Candidate) -> float:
        self.finish()
        state = resources.machine_conditions()  # the machine at every start (the report's conditions)
        began = time.perf_counter()
        self.progress(f"  starting Ray Serve: {candidate.label}")
        plan = self.plan
        archive = plan.model_store / (plan.archive or f"{plan.model}.mar")
        app = serve_config.AppPlan(plan.model, archive, candidate.settings(plan.response_timeout_s))
        config = serve_config.write(self._folder / "serve.yaml", serve_config.portable((app,)))
        server = RayServe(plan.model_store, serve_file=config, haproxy=self.haproxy)
        server.__enter__()  # left in finish(): SIGTERM becomes a clean stop meanwhile
        self._server, self._candidate = server, candidate
        self.conditions.append({"candidate": candidate.key, **state, "ready_s": server.started_s})
        target, payloads = self._target()
        runner.warm_up(target, payloads, plan.load.warmup_s,
                       max(2, min(plan.load.connections, 2 * candidate.workers * candidate.batch_size)))
        spent = time.perf_counter() - began + self._pending_s
        self._pending_s = 0.0
        return spent

    def _measure(self, candidate: Candidate, rate: float, overhead: float) -> Point:
        target, payloads = self._target()
        # The cluster's processes count as the server's (no TorchServe metrics: the batch figures stay empty).
        groups = resources.ProcessGroups.for_server(None, [p.pid for p in self._server.processes()])

        def probe():
            return server_metrics.Scrape.of(""), groups.read()

        self.progress(f"  open loop at {rate:.1f} req/s")
        began = time.perf_counter()
        window_s = self.plan.load.window_at(rate)
        result = loadgen.open_loop(target, payloads, rate, self.plan.load.rule, window_s, self.plan.load.connections,
                                   seed=int(rate * 1000) % 2**31, drain_s=max(5.0, 2 * window_s), probe=probe,
                                   progress=lambda line: self.progress(f"  {line.strip()}"))
        point = point_from(result, self.plan.model, candidate, time.perf_counter() - began, overhead)
        self.progress(f"  {rate:.1f} req/s offered: {point.achieved_rps:.1f} served, p99 {point.p99_ms} ms, "
                      f"{point.errors} errors")
        return point


def write_plan(path: Path, model: str, archive: Path, settings: ModelSettings) -> Path:
    """The model's app in `path` replaced by the tuned one (created if absent); other apps kept."""
    app = serve_config.AppPlan(model, archive, settings)
    tuned = serve_config.portable((app,))
    if path.is_file():
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        others = [a for a in config.get("applications") or [] if a.get("name") != model]
        config["applications"] = [*others, *tuned["applications"]]
    else:
        config = tuned
    return serve_config.write(path, config)


def verify_file(path: Path, model_store: Path, progress: Progress, haproxy: bool = True) -> dict:
    """Serve the file itself on a fresh cluster; one request per model in it must get 200."""
    answers = {}
    began = time.perf_counter()
    with RayServe(model_store, serve_file=path, haproxy=haproxy) as cluster:
        for app in cluster.apps:
            payload = loadgen.payloads_for(app.model)[0]
            answer = cluster.predict(app.model, payload.body, payload.content_type)
            answers[app.model] = {"status": answer.status_code, "bytes": len(answer.content),
                                  "settings": app.settings.to_json()}
            progress(f"verify {shown(path)}: {app.model} answered {answer.status_code}")
        ready_s = cluster.started_s
    passed = bool(answers) and all(a["status"] == 200 for a in answers.values())
    return {"serve_config": shown(path), "passed": passed, "ready_s": ready_s, "answers": answers,
            "seconds": round(time.perf_counter() - began, 1)}


def _chosen(folder: Path) -> Optional[Candidate]:
    report = json.loads((folder / "report.json").read_text(encoding="utf-8"))
    chosen = report.get("chosen")
    return None if chosen is None else Candidate(**chosen["candidate"])


def main(argv: Sequence[str]) -> int:
    processes.sigterm_as_interrupt()
    p = command.parser()
    p.prog = "python -m benchmarks tune-ray"
    p.add_argument("--serve-config", type=Path, default=DEFAULT_SERVE_CONFIG,
                   help="Ray Serve's config file to write (default: ./ray-serve.yaml)")
    p.add_argument("--proxy", dest="haproxy", action="store_false",
                   help="measure behind Serve's Python proxy instead of its HAProxy ingress (what make serve ENGINE=ray runs)")
    args = p.parse_args(argv)
    if args.mix or args.resume:
        raise TuneError("tune-ray tunes one model at a time from the start: --mix and --resume are TorchServe's")
    # The search's steps as `tune` runs them; writing and verifying are Ray's (below), not config.properties'.
    args.no_write, args.no_verify = True, True
    generating, args.model = command.split_generating(args.model)
    if generating:
        raise TuneError(f"{', '.join(generating)}: a generating model's tune is TorchServe's only (make tune)")
    status = 0
    plans: list[ServePlan] = []  # what the pipeline served: the archive (variant) it chose

    def serve_with(plan: ServePlan, progress: Progress) -> RayMeasurer:
        plans.append(plan)
        return RayMeasurer(plan, progress, haproxy=args.haproxy)

    for options in command.runs_from(args, argv, "tune-ray"):
        progress = command.progress_for(options.model)
        try:
            tune_model(options, progress, serve_with=serve_with)
            chosen = _chosen(options.folder)
            if chosen is None:
                status = max(status, 1)
                continue
            archive = options.model_store / (plans[-1].archive or f"{options.model}.mar")
            path = write_plan(args.serve_config, options.model, archive, chosen.settings())
            progress(f"wrote {chosen.label} into {shown(path)}")
            verified = verify_file(path, options.model_store, progress, haproxy=args.haproxy)
        except KeyboardInterrupt:
            return 130
        except (LauncherError, BenchmarkError) as exc:  # the launcher's, the tuner's and the config's errors
            print(f"error [{options.model}]: {exc}", file=sys.stderr)
            status = 2
            continue
        record = {"chosen": chosen.to_json(), "written": shown(path), "verification": verified,
                  "ingress": "HAProxy" if args.haproxy else "proxy"}
        (options.folder / "ray.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        report.write(options.folder, {**json.loads((options.folder / "report.json").read_text(encoding="utf-8")),
                                      "ray": record})
        progress(f"verification {'passed' if verified['passed'] else 'FAILED'}: {shown(options.folder)}/ray.json")
        status = max(status, 0 if verified["passed"] else 1)
    return status
