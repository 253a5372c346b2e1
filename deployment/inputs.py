"""What a deployment is generated from, read once: config.properties, its mix record, the archives."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from benchmarks.tune.errors import TuneError
from deployment.errors import DeployError
from serving.errors import ConfigError
from serving.mix_record import MixRecord, read_mix
from serving.plan_check import record_mismatches
from serving.ts_config import ModelEntry, ServerConfig

TUNE_FIX = 'make tune MIX=minilm=0.7,efficientnet_lite0=0.3'


@dataclass(frozen=True)
class Inputs:
    repo: Path
    config: ServerConfig
    mix: MixRecord
    entries: tuple[ModelEntry, ...]  # models= entries of the mix's models, in the record's order
    archives: Mapping[str, Path]  # model name -> its built .mar
    gpus: int = 0  # GPUs per replica (make deploy GPU=1): torch's CUDA build, nvidia.com/gpu, number_of_gpu

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.mix.models)


def _check_entry(path: Path, entry: ModelEntry, mix: MixRecord) -> None:
    """The models= values must be the ones the mix was measured with: the capacity and the cores
    budget hold for those values only."""
    share = next(m for m in mix.models if m.name == entry.name)
    wrong = record_mismatches(entry, share)
    if wrong:
        raise DeployError(f"{path}: models.{entry.name} disagrees with the mix record: {', '.join(wrong)}; "
                          f"the record's capacity holds for its own values only: re-tune ({TUNE_FIX})")


def load(repo: Path, config_path: Path, gpus: int = 0) -> Inputs:
    try:
        config = ServerConfig.load(config_path)
        mix = read_mix(config_path)
    except (ConfigError, TuneError, OSError) as exc:
        raise DeployError(f"{config_path}: {exc}") from exc
    if mix is None:
        raise DeployError(f"{config_path} has no mix record (a '# mix-record: ' line): plan and deploy size "
                          f"replicas from a mix's measured capacity. Tune one first: {TUNE_FIX}")
    if not mix.models or mix.capacity_rps <= 0 or mix.cores < 1:
        raise DeployError(f"{config_path}: mix record without models, capacity or cores; re-tune ({TUNE_FIX})")
    by_name = {e.name: e for e in config.models}
    missing = [m.name for m in mix.models if m.name not in by_name]
    if missing:
        raise DeployError(f"{config_path}: the mix record names {', '.join(missing)}, absent from models=; "
                          f"re-tune ({TUNE_FIX})")
    entries = tuple(by_name[m.name] for m in mix.models)
    for entry in entries:
        _check_entry(config_path, entry, mix)
    store = repo / "model_store"
    archives = {e.name: store / e.archive for e in entries}
    absent = [str(p) for p in archives.values() if not p.is_file()]
    if absent:
        raise DeployError(f"archives missing: {', '.join(absent)} (build them: make build)")
    if gpus < 0:
        raise DeployError(f"--gpus: 0 (a CPU image) or more GPUs per replica, got {gpus}")
    return Inputs(repo=repo, config=config, mix=mix, entries=entries, archives=archives, gpus=gpus)
