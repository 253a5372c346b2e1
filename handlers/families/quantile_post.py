"""Post-processing of a batch of quantile forecasts, as array operations over the whole batch.

`forecast_rows` sorts each step's quantiles (so they never cross), clips them to the declared range
and finds, for every threshold of every series, the first step (1-based) within its alert window
where each quantile is at or above it: NumPy over (rows, steps, thresholds, quantiles) at once.
`forecast_rows_loop` does the same value by value in Python: the naive path the in-process
benchmark measures against, and the reference the unit tests hold the arrays to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass(frozen=True)
class RowOptions:
    """What one series asked for: steps to return, thresholds to watch, over how many steps."""

    horizon: int
    thresholds: tuple[float, ...] = ()
    alert_within: int = 0  # steps the alerts look at (<= horizon)


def quantile_key(q: float) -> str:
    """0.1 -> "p10", 0.025 -> "p2.5"."""
    return f"p{round(q * 100, 6):g}"


def forecast_rows(values: np.ndarray, options: Sequence[RowOptions], keys: Sequence[str],
                  low: Optional[float], high: Optional[float]) -> list[dict]:
    """values (rows, steps, quantiles) -> one answer per row: {"horizon", "quantiles", "alerts"}."""
    values = np.sort(values, axis=-1)
    if low is not None or high is not None:
        values = np.clip(values, low, high)
    rows, steps, _ = values.shape
    width = max((len(o.thresholds) for o in options), default=0)
    first = np.zeros((rows, width, len(keys)), np.int64)
    if width:
        thresholds = np.full((rows, width), np.nan)
        within = np.zeros(rows, np.int64)
        for r, o in enumerate(options):  # per series, not per value: its thresholds into one array
            thresholds[r, :len(o.thresholds)] = o.thresholds
            within[r] = o.alert_within
        # (rows, steps, thresholds, quantiles); NaN padding compares False.
        crossed = values[:, :, None, :] >= thresholds[:, None, :, None]
        crossed &= (np.arange(steps)[None, :] < within[:, None])[:, :, None, None]
        first = np.where(crossed.any(axis=1), crossed.argmax(axis=1) + 1, 0)
    answers = []
    # (rows, quantiles, steps), contiguous: each answer holds views the JSON encoder writes as they are.
    columns = np.ascontiguousarray(values.transpose(0, 2, 1))
    for r, o in enumerate(options):
        steps_of = first[r].tolist()
        answers.append({
            "horizon": o.horizon,
            "quantiles": dict(zip(keys, columns[r, :, :o.horizon])),
            "alerts": [{"threshold": t, "within": o.alert_within,
                        "first_step": {k: (s or None) for k, s in zip(keys, steps_of[i])}}
                       for i, t in enumerate(o.thresholds)],
        })
    return answers


def forecast_rows_loop(values: np.ndarray, options: Sequence[RowOptions], keys: Sequence[str],
                       low: Optional[float], high: Optional[float]) -> list[dict]:
    """The same answers, one Python operation per value (sorted(), min/max, a scan per threshold);
    values in the array's own type, so that both encode to the same JSON."""
    low, high = (None if b is None else float(values.dtype.type(b)) for b in (low, high))  # as np.clip casts
    answers = []
    for r, o in enumerate(options):
        table = [[] for _ in keys]
        for step in range(values.shape[1]):
            ordered = sorted(float(v) for v in values[r, step])
            for q, v in enumerate(ordered):
                if low is not None and v < low:
                    v = low
                if high is not None and v > high:
                    v = high
                table[q].append(values.dtype.type(v))
        alerts = []
        for t in o.thresholds:
            first_step = {}
            for q, key in enumerate(keys):
                first_step[key] = None
                for step in range(o.alert_within):
                    if table[q][step] >= t:
                        first_step[key] = step + 1
                        break
            alerts.append({"threshold": t, "within": o.alert_within, "first_step": first_step})
        answers.append({"horizon": o.horizon, "quantiles": {k: column[:o.horizon] for k, column in zip(keys, table)},
                        "alerts": alerts})
    return answers
