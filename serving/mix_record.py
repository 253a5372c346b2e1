"""The mix a config.properties was tuned for: one record in the file, read by `make plan`/`make deploy`.

The tuner writes it as comment lines above the models= stanza (TorchServe ignores comments): a few
lines for people, then one line of JSON for tools:

    # tuned mix: minilm 70% (p99 <= 50 ms), efficientnet_lite0 30% (p99 <= 100 ms): 251.3 req/s per server
    #   ...
    # mix-record: {"capacity_rps": 251.3, "cores": 2, "models": [...], ...}
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from serving.errors import ConfigError

MIX_PREFIX = "# tuned mix: "
RECORD_PREFIX = "# mix-record: "
MORE = "#   "


@dataclass(frozen=True)
class ModelShare:
    """One model of the mix: its share of the requests, its SLO, the values written for it, and
    what it measured at the mix's capacity point."""

    name: str
    share: float
    slo_ms: float
    workers: int
    threads: int
    batch_size: int
    max_batch_delay_ms: int
    rate_rps: float  # its part of the total at the capacity point
    p99_ms: float
    archive: str = ""  # the archive it was served from (its variant: build/variants.py); "": <name>.mar

    @property
    def served_archive(self) -> str:
        return self.archive or f"{self.name}.mar"


@dataclass(frozen=True)
class MixRecord:
    models: tuple[ModelShare, ...]
    capacity_rps: float  # total requests/s one server answers in this mix, every model within its SLO
    baseline_rps: Optional[float]  # the same mix on the values the file had before this tune, same run
    cores: int  # the budget: sum of workers x threads over the mix's models
    memory_mib: Optional[float]  # frontend + workers, peak RSS at the capacity point
    date: str
    report: str
    machine: str
    # Every model the server loaded while it was measured (the mix's and idle ones); empty: not recorded.
    loaded: tuple[str, ...] = ()
    # The values written are the ones the file had before: capacity_rps and baseline_rps then measure
    # the same values twice, and their difference is the host's spread, not a gain.
    unchanged: bool = False

    @property
    def shares(self) -> dict[str, float]:
        return {m.name: m.share for m in self.models}

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict) -> MixRecord:
        try:
            models = tuple(ModelShare(**m) for m in raw["models"])
            return cls(**{**raw, "models": models, "loaded": tuple(raw.get("loaded", ()))})
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"mix record: {exc} (re-tune with python -m benchmarks tune --mix ...)") from exc

    def lines(self) -> tuple[str, ...]:
        parts = ", ".join(f"{m.name} {m.share:.0%} (p99 <= {m.slo_ms:g} ms)" for m in self.models)
        baseline = "" if self.baseline_rps is None else (
            f"; the same values measured before, in this run: {self.baseline_rps:.1f} req/s (unchanged by this tune)"
            if self.unchanged else f"; the values before this tune, in this mix: {self.baseline_rps:.1f} req/s")
        text = [f"{MIX_PREFIX}{parts}: {self.capacity_rps:.1f} req/s per server{baseline}"]
        text += [f"{MORE}{m.name}: {m.workers} x {m.threads} thread(s), batch {m.batch_size}, delay "
                 f"{m.max_batch_delay_ms} ms, {m.served_archive}; {m.rate_rps:.1f} req/s at p99 {m.p99_ms:.1f} ms"
                 for m in self.models]
        text.append(f"{MORE}{self.date}; report {self.report}; machine {self.machine}")
        text.append(RECORD_PREFIX + json.dumps(self.to_json(), separators=(",", ":")))
        return tuple(t.replace("\r", " ").replace("\n", " ") for t in text)


def read_mix(config: Path) -> Optional[MixRecord]:
    """The mix record of a config.properties, or None when it was not tuned for a mix."""
    found = None
    for line in Path(config).read_text(encoding="utf-8").splitlines():
        if line.startswith(RECORD_PREFIX):
            try:
                found = json.loads(line[len(RECORD_PREFIX):])
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{config}: unreadable mix record ({exc}); re-tune with --mix") from exc
    return None if found is None else MixRecord.from_json(found)
