"""The variant dimension of a tuning run: which archive of the model (build/variants.py) to serve.

Each variant that passed the build's accuracy gate gets its own in-process fit (service time per
batch size and thread count); its service model predicts the best capacity at the SLO over the
search space; the best predicted variant is the one the served search tunes and the writer names in
config.properties (marName, load_models). A variant within `TIE` of the default keeps the default:
a different numeric path is served only for a gain larger than the served measurements' own spread
(a second run of the mix tune landed 6.8% below its first), because it costs accuracy (within the
gate, but not nothing) and, with dynamic int8, makes an answer depend on its batch-mates (the
activation scale is computed over the whole batch).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Optional

from benchmarks.tune.errors import TuneError
from benchmarks.tune.fit import FitPlan
from benchmarks.tune.service_model import FitPoint, ServiceModel
from benchmarks.tune.space import Space
from build.archive import BuildResult

TIE = 0.10  # a variant must beat the default's predicted capacity by more than this share

Progress = Callable[[str], None]


def eligible(built: BuildResult, asked: Optional[Sequence[str]]) -> list:
    """The variants to fit: those asked for (each must have passed the gate), else the one the catalogue
    pins, else every passing one (eager, TorchScript, AOTInductor, ONNX, int8: whichever the entry lists)."""
    passed = built.archives
    if asked is None and built.pinned is not None:
        asked = [built.pinned]
    if asked is None:
        return list(passed)
    known = {v.variant: v for v in built.variants}
    for name in asked:
        if name not in known:
            raise TuneError(f"--variant {name}: {built.name} has no such variant (catalogue: {', '.join(known)})")
        if name not in passed:
            which = "the catalogue's pinned variant" if name == built.pinned else "--variant"
            raise TuneError(f"{which} {name}: not archived, the build's accuracy gate (or export) rejected it "
                            f"({known[name].gate})")
    return list(dict.fromkeys(asked))


def predicted_best(points: Sequence[dict], space: Space, slo_ms: float) -> dict:
    """The service model's best candidate at the SLO, from one variant's in-process fit."""
    service = ServiceModel.fit(FitPoint.from_json(p) for p in points)
    fitted = set(service.by_threads)
    best = None
    for candidate in space.candidates():
        if candidate.threads not in fitted:
            continue
        prediction = service.predict(candidate, slo_ms)
        if best is None or prediction.rate_rps > best.rate_rps:
            best = prediction
    if best is None:
        return {"rate_rps": 0.0, "candidate": None}
    return {"rate_rps": round(best.rate_rps, 1), "candidate": best.candidate.label}


def choose(fits: Mapping[str, dict], built: BuildResult, space: Space, slo_ms: float, default: str,
           progress: Progress) -> dict:
    """{"variant": chosen, "variants": {name: {gate, items_per_s, predicted}}}: the fits' verdict."""
    table: dict[str, dict] = {}
    lines = {v.variant: v for v in built.variants}
    for name, fit in fits.items():
        table[name] = {"gate": lines[name].gate, "gate_worst": lines[name].gate_worst,
                       "items_per_s": {str(p["batch_size"]): round(1000.0 * p["batch_size"] / p["service_ms"], 1)
                                       for p in fit["points"] if p["threads"] == min(q["threads"] for q in fit["points"])},
                       "predicted": predicted_best(fit["points"], space, slo_ms)}
        progress(f"variant {name}: predicted {table[name]['predicted']['rate_rps']:.1f} req/s at the SLO "
                 f"({table[name]['predicted']['candidate']}); gate {lines[name].gate}")
    rate = {name: row["predicted"]["rate_rps"] for name, row in table.items()}
    best = max(rate, key=rate.get)
    chosen = best
    if default in rate and rate[best] <= rate[default] * (1 + TIE):
        chosen = default
    if default in rate and rate[default] > 0 and best != default:
        progress(f"variant chosen: {chosen} (best other: {best} at {rate[best] / rate[default]:.2f}x the default's "
                 f"predicted capacity; a variant needs > {1 + TIE:.2f}x)")
    else:
        progress(f"variant chosen: {chosen}")
    return {"variant": chosen, "variants": table}


def fit_variants(plan: FitPlan, names: Sequence[str], fit_one: Callable[[FitPlan], dict], built: BuildResult,
                 space: Space, slo_ms: float, default: str, progress: Progress) -> dict:
    """The in-process fit of every variant; returns the chosen one's fit with the choice beside it."""
    fits = {}
    for name in names:
        progress(f"in-process fit of variant {name}")
        fits[name] = fit_one(replace(plan, variant=name))
    verdict = choose(fits, built, space, slo_ms, default, progress)
    chosen = fits[verdict["variant"]]
    return {**chosen, "seconds": sum(f.get("seconds", 0.0) for f in fits.values()), **verdict}
