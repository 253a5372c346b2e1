"""The tuner's checkpoint: every measurement, saved the moment it is taken.

It watches results go by rather than standing in any step's way: `Replaying` wraps the measurer
the strategies use, records each point it passes on, and answers from the record when the same
point (phase, candidate, rate) is asked for again. The strategies are deterministic given their
measurements (predictions come from a fixed-seed simulation), so resuming is replay: a resumed run
walks the same path until it reaches the first measurement it has not taken yet. Servers are
started lazily by the measurer, so a replayed candidate costs no server start. The times recorded
with each measurement are kept, so a resumed run still reports what its measurements cost.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

from benchmarks.tune.errors import CheckpointError
from benchmarks.tune.rates import Measurer
from benchmarks.tune.results import Point
from benchmarks.tune.space import Candidate

FORMAT = 1


def _rate_key(rate: float) -> str:
    return repr(round(float(rate), 6))


class Checkpoint:
    """A JSON file (or nothing, with path None) of measurements keyed by phase, candidate and rate."""

    def __init__(self, path: Optional[Path], identity: dict[str, Any]) -> None:
        self.path = None if path is None else Path(path)
        self.identity = json.loads(json.dumps(identity))  # as it will read back
        self.data: dict[str, Any] = {"format": FORMAT, "identity": self.identity, "fit": None, "points": {}}
        self.replayed = 0
        if self.path is not None and self.path.is_file():
            self._load()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"cannot read checkpoint {self.path}: {exc}") from exc
        if data.get("format") != FORMAT:
            raise CheckpointError(f"{self.path}: checkpoint format {data.get('format')!r}, expected {FORMAT}")
        if data.get("identity") != self.identity:
            theirs, ours = data.get("identity") or {}, self.identity
            differ = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
            raise CheckpointError(
                f"{self.path} belongs to another tuning run (differs in: {', '.join(differ)}); "
                "resume with the same options, or start a new run")
        self.data = data

    @property
    def resumed(self) -> bool:
        return bool(self.data["points"] or self.data["fit"])

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1), encoding="utf-8")
        os.replace(tmp, self.path)  # never a half-written checkpoint

    # -- in-process fit ------------------------------------------------------------------------
    def fit(self, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        if self.data["fit"] is None:
            self.data["fit"] = measure()
            self.save()
        else:
            self.replayed += 1
        return self.data["fit"]

    # -- served measurements ---------------------------------------------------------------------
    def point(self, phase: str, candidate: str, rate: float, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        key = f"{phase}|{candidate}|{_rate_key(rate)}"
        if key in self.data["points"]:
            self.replayed += 1
            return self.data["points"][key]
        value = measure()
        self.data["points"][key] = value
        self.save()
        return value

    def replaying(self, measurer: Measurer) -> Replaying:
        return Replaying(self, measurer)

    def get(self, name: str, default: Any = None) -> Any:
        return self.data.get("extra", {}).get(name, default)

    def put(self, name: str, value: Any) -> None:
        """A small named result (e.g. the verification) kept with the measurements."""
        self.data.setdefault("extra", {})[name] = value
        self.save()


class Replaying:
    """A measurer that answers from the checkpoint what it already holds and records the rest."""

    def __init__(self, checkpoint: Checkpoint, measurer: Measurer) -> None:
        self.checkpoint, self.measurer = checkpoint, measurer

    def measure(self, phase: str, candidate: Candidate, rate_rps: float) -> Point:
        raw = self.checkpoint.point(phase, candidate.key, rate_rps,
                                    lambda: self.measurer.measure(phase, candidate, rate_rps).to_json())
        return Point.from_json(raw)

    def finish(self) -> None:
        self.measurer.finish()
