"""One model's tuning run, as a pipeline:

    in-process fit per variant (the best predicted archive is the one served) -> TorchServe's
      defaults -> model-guided search -> the shortest delay
      -> write config.properties -> verify from the written file -> report

Each step gets the frozen part of the options it uses. Every served point goes through one
measurer (a TorchServe per candidate, started on demand), wrapped by the checkpoint, which records
each point and answers from its record on resume.
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.load import resources
from benchmarks.load.budget import Budget
from benchmarks.load.environment import describe_environment
from benchmarks.tune import report, variants
from benchmarks.tune.checkpoint import Checkpoint
from benchmarks.tune.config_writer import check_archives
from benchmarks.tune.fit import FitPlan, inprocess_fit
from benchmarks.tune.measure import ServedMeasurer, ServePlan
from benchmarks.tune.options import TuneOptions
from benchmarks.tune.outcome import WritePlan, write_and_verify
from benchmarks.tune.search import Fixed, ModelGuided, Proposal, run, shorter_delay
from benchmarks.tune.service_model import FitPoint, ServiceModel
from benchmarks.tune.space import torchserve_defaults
from build.archive import build_entry
from build.catalogue import Catalogue
from serving.repo import CATALOGUE, REPO_ROOT, shown

Progress = Callable[[str], None]


def tune_model(options: TuneOptions, progress: Progress,
               serve_with: Callable[[ServePlan, Progress], ServedMeasurer] = ServedMeasurer) -> int:
    """One model, end to end. 0: tuned (and verified, unless skipped); 1: nothing met the SLO, or
    the verification failed. `serve_with` makes the measurer (a stand-in in the replay test)."""
    # The search's candidates stop where the budget ends; the written file is verified whatever is left.
    budget = Budget(options.budget_s)
    checkpoint = Checkpoint(options.folder / "checkpoint.json", dict(options.record))
    if checkpoint.resumed:
        progress(f"resuming from {shown(options.folder)}: measurements already taken are replayed, not repeated")
    model, space, slo, steps = options.model, options.space, options.slo_ms, options.steps
    progress(f"SLO p99 <= {slo:g} ms; space: {len(space.candidates())} candidates over {space.to_json()}; "
             f"report {shown(options.folder)}")
    catalogue = Catalogue.load(CATALOGUE)
    built = build_entry(catalogue, model, REPO_ROOT, options.model_store, progress=progress)
    names = variants.eligible(built, options.variants)
    if steps.write:
        check_archives({f"{model} ({v})": built.archives[v] for v in names})  # before an hour of measuring
    before = resources.machine_conditions()
    if before["other_torchserve_pids"]:
        progress(f"warning: other TorchServe servers are running (pids {before['other_torchserve_pids']}): "
                 "they share the cores, numbers will be noisy")

    defaults = torchserve_defaults(space.cores)
    threads = sorted(set(space.thread_counts) | ({defaults.threads} if steps.defaults else set()))
    fit_plan = FitPlan(model, tuple(threads), space.max_batch_size, slo, options.fit_seconds, options.wait_quiet_s,
                       device=options.device)

    def fit_one(plan: FitPlan) -> dict:
        if options.wait_quiet_s > 0:
            resources.wait_for_quiet(options.wait_quiet_s, progress)
        return inprocess_fit(plan, progress)

    # The variant dimension: a fit per variant, the best predicted one searched (benchmarks/tune/variants.py).
    default = catalogue.entry(model).default_variant.name
    fit = checkpoint.fit(lambda: variants.fit_variants(fit_plan, names, fit_one, built, space, slo, default, progress))
    archive = built.archives[fit.get("variant", default)]  # a fit checkpointed before variants: the default
    service = ServiceModel.fit(FitPoint.from_json(p) for p in fit["points"])
    serve = ServePlan(model, options.model_store, options.config, options.load, slo, options.wait_quiet_s,
                      archive=archive.name, device=options.device)
    defaults_result = None
    with serve_with(serve, progress) as live:
        live.budget = budget
        measurer = checkpoint.replaying(live)
        if steps.defaults:
            predicted = service.predict(defaults, slo)
            progress(f"TorchServe defaults: {defaults.label} (predicted {predicted.rate_rps:.1f} req/s)")
            first = Proposal(defaults, max(predicted.rate_rps, 1.0), predicted)
            measured = run(Fixed([first], "defaults", options.search.rates), measurer, slo, progress, budget).results
            defaults_result = measured[0] if measured else None
        guided = ModelGuided(space.candidates(), service, slo, options.search,
                             (defaults_result,) if defaults_result else (), progress)
        result = guided.result(run(guided, measurer, slo, progress, budget))
        result = shorter_delay(result, space, measurer, slo, options.search, progress, budget)
    conditions = {"before": before, "after": resources.machine_conditions(), "starts": live.conditions}
    environment = describe_environment()

    plan = WritePlan(serve, steps.write, steps.verify, catalogue.entry(model).version,
                     options.search.rates.resolution, options.verify, options.folder)
    written, verification = write_and_verify(plan, result.chosen, defaults_result, environment, archive, checkpoint,
                                             progress)
    content = report.build(options, fit, service, result, defaults_result, conditions, environment, written,
                           verification)
    report.write(options.folder, content)
    report.print_summary(content, options.folder)
    if result.chosen is None:
        return 1
    return 0 if verification is None or verification.passed else 1
