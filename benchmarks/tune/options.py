"""One model's tuning run, read once into frozen dataclasses: each step of the pipeline then gets
the part it uses (the space, the search settings, the load, the steps to run), never the whole.

The run's options as given (a flat JSON record of the command line) are kept beside them: the
checkpoint holds that record as its identity, and `--resume` rebuilds the run from it through
the same checks. Paths inside the repository are recorded relative to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Optional

from benchmarks.load.capacity import RateSettings
from benchmarks.load.stats import StabilityRule
from benchmarks.tune.errors import TuneError
from benchmarks.tune.measure import LoadSettings
from benchmarks.tune.search import SearchSettings
from benchmarks.tune.space import PRESETS, Space, preset
from benchmarks.tune.verify import VerifySettings
from serving.repo import REPO_ROOT, shown
from serving.ts_config import DEVICES

# The record's keys; `folder` and `wait_quiet` are where a run writes and how patiently it waits,
# not what it measures, so they stay out of it (a resumed run may change both).
RECORD_KEYS = ("model", "slo_ms", "cores", "config", "model_store", "out", "space", "workers", "batch_sizes",
               "delays", "min_gain_pct", "max_candidates", "patience", "rate_step", "rate_resolution",
               "max_points", "fit_seconds", "window_s", "max_windows", "stable_windows", "stability_pct",
               "warmup_s", "connections", "point_requests", "tie_pct", "verify_points", "verify_warmup_s",
               "verify_stability_pct", "no_defaults", "no_write", "no_verify", "variant", "device")
# Keys a run recorded before they existed may lack, with the value such runs used.
OPTIONAL_KEYS = {"variant": None, "verify_stability_pct": VerifySettings.stability_pct, "device": "cpu"}
# Keys of options since retired that older runs recorded: read past, never acted on.
RETIRED_KEYS = ("grid",)
# The smallest value each numeric option may take ("above" excludes the bound itself).
_AT_LEAST = {"cores": 1, "max_candidates": 1, "patience": 1, "max_points": 1, "max_windows": 1,
             "stable_windows": 1, "connections": 1, "warmup_s": 0, "point_requests": 0, "tie_pct": 0,
             "verify_points": 1, "verify_warmup_s": 0}
_ABOVE = {"slo_ms": 0, "min_gain_pct": 0, "rate_step": 1, "rate_resolution": 1, "fit_seconds": 0, "window_s": 0,
          "stability_pct": 0, "verify_stability_pct": 0}


@dataclass(frozen=True)
class Steps:
    defaults: bool = True  # measure TorchServe's defaults first (the "before", and a first calibration)
    write: bool = True  # write the chosen values into config.properties
    verify: bool = True  # restart from the written file and measure again


@dataclass(frozen=True)
class TuneOptions:
    model: str
    slo_ms: float
    space: Space
    search: SearchSettings
    load: LoadSettings
    fit_seconds: float
    steps: Steps
    verify: VerifySettings
    config: Path
    model_store: Path
    variants: Optional[tuple[str, ...]]  # the catalogue variants to choose among; None: every one that passed
    folder: Path  # the report folder (checkpoint included)
    wait_quiet_s: float
    record: Mapping[str, Any]
    command: str
    device: str = "cpu"  # where the fit and the servers' workers run (cuda: one GPU)
    budget_s: Optional[float] = None  # the search's time budget (None: none); not recorded, like wait_quiet_s

    @classmethod
    def from_record(cls, record: Mapping[str, Any], folder: Path, wait_quiet_s: float = 0.0,
                    command: str = "", budget_s: Optional[float] = None) -> TuneOptions:
        unknown = sorted(set(record) - set(RECORD_KEYS) - set(RETIRED_KEYS))
        missing = [key for key in RECORD_KEYS if key not in record and key not in OPTIONAL_KEYS]
        if unknown or missing:
            raise TuneError(f"tuning options: unknown {unknown or 'none'}, missing {missing or 'none'} "
                            "(a checkpoint from another version of the tuner? start a new run)")
        # The record itself stays as given: a checkpoint's identity.
        r = {**OPTIONAL_KEYS, **{k: v for k, v in record.items() if k not in RETIRED_KEYS}}
        for key in (*_AT_LEAST, *_ABOVE):
            value = r[key]
            low_ok = value >= _AT_LEAST[key] if key in _AT_LEAST else value > _ABOVE.get(key, 0)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not low_ok:
                bound = f"at least {_AT_LEAST[key]}" if key in _AT_LEAST else f"above {_ABOVE[key]}"
                raise TuneError(f"--{key.replace('_', '-')} must be a number {bound}, got {value!r}")
        if r["tie_pct"] >= 100:
            raise TuneError(f"--tie-pct must be below 100 (a share of the best capacity), got {r['tie_pct']!r}")
        if r["space"] not in PRESETS:
            raise TuneError(f"--space {r['space']!r}: choose one of {', '.join(PRESETS)}")
        if r["device"] not in DEVICES:
            raise TuneError(f"--device {r['device']!r}: one of {', '.join(DEVICES)}")
        if wait_quiet_s < 0:
            raise TuneError(f"--wait-quiet must be >= 0 seconds, got {wait_quiet_s}")
        if budget_s is not None and budget_s <= 0:
            raise TuneError(f"--budget-min must be > 0 (0 on the command line: no budget), got {budget_s / 60:g}")
        try:
            rule = StabilityRule(tolerance_pct=r["stability_pct"], last=r["stable_windows"],
                                 max_windows=max(r["max_windows"], r["stable_windows"]), warmup=1)
        except ValueError as err:
            raise TuneError(f"stability rule: {err}") from None
        return cls(
            model=str(r["model"]), slo_ms=float(r["slo_ms"]),
            space=preset(r["space"], r["cores"], r["workers"], r["batch_sizes"], r["delays"]),
            search=SearchSettings(r["min_gain_pct"], r["max_candidates"], r["patience"],
                                  RateSettings(r["rate_step"], r["rate_resolution"], r["max_points"]),
                                  float(r["tie_pct"])),
            load=LoadSettings(r["window_s"], rule, r["connections"], r["warmup_s"], int(r["point_requests"])),
            fit_seconds=float(r["fit_seconds"]),
            steps=Steps(defaults=not r["no_defaults"], write=not r["no_write"], verify=not r["no_verify"]),
            verify=VerifySettings(int(r["verify_points"]), float(r["verify_warmup_s"]), float(r["verify_stability_pct"])),
            config=_path(r["config"]), model_store=_path(r["model_store"]),
            variants=None if r.get("variant") is None else tuple(str(v) for v in r["variant"]), folder=Path(folder).resolve(),
            wait_quiet_s=float(wait_quiet_s), record=MappingProxyType(dict(record)), command=command,
            device=str(r["device"]), budget_s=budget_s)


def record_of(options: Mapping[str, Any], model: str, slo_ms: float, cores: int) -> dict:
    """The record of a new run from the command line's options (argparse names), JSON-ready."""
    record = {key: options[key] for key in RECORD_KEYS if key in options}
    record.update(model=model, slo_ms=float(slo_ms), cores=int(cores))
    record["space"] = record.get("space") or ("gpu" if record.get("device") == "cuda" else "full")
    for key in ("config", "model_store", "out"):
        record[key] = shown(record[key])
    for key in ("workers", "batch_sizes", "delays", "variant"):
        record[key] = None if record[key] is None else list(record[key])
    return record


def _path(value: Optional[str]) -> Path:
    """A recorded path: relative ones are the repository's."""
    path = Path(str(value))
    return path if path.is_absolute() else REPO_ROOT / path
