"""How many replicas a request rate needs, from the mix's measured per-server capacity.

    replicas = ceil(RATE / (capacity_rps x (1 - headroom)))

The capacity is the total rate one server answered in the tuned mix with every model within its
SLO; the headroom keeps each replica below it (bursts, a replica restarting, noisy neighbours). The
HPA gets minReplicas = replicas and maxReplicas = ceil(MAX_FACTOR x replicas) (at least one more),
and scales on CPU at a target of (1 - headroom): the same margin, seen from the pod's side.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

from deployment.errors import DeployError
from serving.mix_record import MixRecord

DEFAULT_HEADROOM = 0.3
# Above the planned rate the HPA may go this far: a 2x surge before requests queue past the SLO.
MAX_FACTOR = 2.0
SHARE_TOLERANCE = 0.05


@dataclass(frozen=True)
class PlanOptions:
    """RATE None: the rate one replica carries within the headroom (so 1 replica)."""

    rate_rps: Optional[float] = None
    mix: Optional[Mapping[str, float]] = None
    headroom: float = DEFAULT_HEADROOM
    max_factor: float = MAX_FACTOR

    def __post_init__(self) -> None:
        if self.rate_rps is not None and not (math.isfinite(self.rate_rps) and self.rate_rps > 0):
            raise DeployError(f"RATE must be a number of requests/s > 0, got {self.rate_rps!r}")
        if not 0 <= self.headroom < 1:
            raise DeployError(f"HEADROOM must be in [0, 1) (a fraction of capacity kept free), got {self.headroom!r}")
        if not self.max_factor >= 1:
            raise DeployError(f"max_factor must be >= 1, got {self.max_factor!r}")


@dataclass(frozen=True)
class Plan:
    rate_rps: float
    rate_given: bool
    capacity_rps: float
    headroom: float
    replicas: int
    max_replicas: int
    max_factor: float
    cpu_target_percent: int

    @property
    def usable_rps(self) -> float:
        return self.capacity_rps * (1 - self.headroom)

    def explain(self, mix: MixRecord) -> str:
        shares = ", ".join(f"{m.name} {m.share:.0%}" for m in mix.models)
        source = "RATE" if self.rate_given else "RATE not given: one replica's usable rate"
        return "\n".join([
            f"mix: {shares}; one server (cores {mix.cores}) answers {self.capacity_rps:.1f} req/s within every SLO",
            f"usable per replica: {self.capacity_rps:.1f} x (1 - {self.headroom:g}) = {self.usable_rps:.1f} req/s",
            f"replicas = ceil({self.rate_rps:.1f} / {self.usable_rps:.1f}) = {self.replicas}   ({source})",
            f"HPA: minReplicas {self.replicas}, maxReplicas {self.max_replicas} (x{self.max_factor:g}, at least +1), "
            f"CPU target {self.cpu_target_percent}% = 1 - headroom",
        ])


def parse_mix(text: str) -> dict[str, float]:
    """'minilm=0.7,efficientnet_lite0=0.3' -> {name: share}."""
    out: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        try:
            share = float(value)
        except ValueError:
            share = -1.0
        if not sep or not name.strip() or not 0 < share <= 1 or name.strip() in out:
            raise DeployError(f"MIX: bad entry {part!r}; expected name=share pairs, e.g. "
                              "MIX=minilm=0.7,efficientnet_lite0=0.3 (each share in (0, 1], names once)")
        out[name.strip()] = share
    if not out:
        raise DeployError("MIX is empty; e.g. MIX=minilm=0.7,efficientnet_lite0=0.3")
    if abs(sum(out.values()) - 1) > 0.01:
        raise DeployError(f"MIX shares sum to {sum(out.values()):g}, not 1")
    return out


def check_mix(wanted: Mapping[str, float], mix: MixRecord) -> None:
    """The traffic asked for must be the traffic tuned for: capacity depends on the shares."""
    tuned = mix.shares
    off: tuple[str, ...] = tuple(
        f"{n}: asked {wanted.get(n, 0):g}, tuned {tuned.get(n, 0):g}" for n in sorted(set(wanted) | set(tuned))
        if abs(wanted.get(n, 0) - tuned.get(n, 0)) > SHARE_TOLERANCE)
    if off:
        asked = ",".join(f"{n}={s:g}" for n, s in wanted.items())
        raise DeployError(f"MIX does not match the tuned mix (tolerance {SHARE_TOLERANCE:g} per share): "
                          f"{'; '.join(off)}. Its capacity was measured for other shares: re-tune for this mix "
                          f'(make tune MIX={asked}) or plan without MIX')


def make_plan(mix: MixRecord, options: PlanOptions) -> Plan:
    if options.mix is not None:
        check_mix(options.mix, mix)
    usable = mix.capacity_rps * (1 - options.headroom)
    rate = usable if options.rate_rps is None else options.rate_rps
    # A hair of tolerance so that RATE = usable exactly gives 1, not 2, after float rounding.
    replicas = max(1, math.ceil(rate / usable - 1e-9))
    max_replicas = max(replicas + 1, math.ceil(options.max_factor * replicas))
    return Plan(rate_rps=rate, rate_given=options.rate_rps is not None, capacity_rps=mix.capacity_rps,
                headroom=options.headroom, replicas=replicas, max_replicas=max_replicas,
                max_factor=options.max_factor,
                cpu_target_percent=max(10, round((1 - options.headroom) * 100)))
