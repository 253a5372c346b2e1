"""Multi-horizon quantile forecasts of one series or several: a history window in, per step the
quantiles the model was trained for out (never crossing), with threshold alerts.

    {"history": [floats], "horizon": 26, "thresholds": [380.0], "alert_within": 13}
    {"series": [{"history": [...]}, {"history": [...], "horizon": 4}]}      # several in one request

The model reads the last `window` values of each history and returns (rows, horizon, quantiles) in
the series' units. Answers: {"horizon", "quantiles": {"p10": [...], "p50": [...], ...}, "alerts":
[{"threshold", "within", "first_step": {"p10": step or null, ...}}]} per series ({"series": [...]}
for the second form). Sorting, clipping to [min, max] and the alert search run over the whole
batch at once (handlers/families/quantile_post.py). Every malformed field is a 400 naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
import torch

from handlers.arrays import in_dtype, json_array
from handlers.errors import BadInput, ConfigError, ServerFault
from handlers.families import forecaster_cases
from handlers.families.base import Family
from handlers.families.cases import Case
from handlers.families.forecaster_settings import ForecasterSettings
from handlers.families.quantile_post import (
    RowOptions,
    forecast_rows,
    forecast_rows_loop,
    quantile_key,
)
from handlers.json_body import read_json

_FIELDS = ("history", "horizon", "thresholds", "alert_within")
_MODEL_DTYPE = "float32"  # what the model reads: a history value it cannot hold is refused
_FORMS = 'send {"history": [numbers], "horizon": n} or {"series": [{"history": [...]}, ...]}'


@dataclass(frozen=True)
class Forecast:
    """One request: its series' windows (rows, window) and what each asked for."""

    windows: np.ndarray
    options: tuple[RowOptions, ...]
    several: bool  # the {"series": [...]} form: answered as {"series": [...]}


@dataclass(frozen=True)
class ForecastBatch:
    """What `collate` returns: the model's input and, beside it, each request's options."""

    windows: torch.Tensor
    forecasts: tuple[Forecast, ...]


def _integer(value: Any, field: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadInput(f"{field}: an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise BadInput(f"{field}: {value} is outside {low}..{high}")
    return value


def _within(history: np.ndarray, outside: np.ndarray, field: str, what: str) -> None:
    """Refuse the first value of the read window outside the declared range, by its index in history."""
    where = np.flatnonzero(outside)
    if where.size:
        index = len(history) - len(outside) + int(where[0])
        raise BadInput(f"{field}[{index}]: {history[index]:g} is {what}")


def _numbers(value: Any, field: str, model_dtype: str = "float64") -> np.ndarray:
    """A flat list of numbers as float64, each one a number the model's dtype holds."""
    if isinstance(value, list) and not value:
        return np.zeros(0)
    array = json_array(value, field)
    if array.ndim != 1:
        raise BadInput(f"{field}: a flat list of numbers, got {array.ndim} levels of nesting")
    in_dtype(array, model_dtype, field)  # true/false, NaN, infinity, or past what the model's dtype holds
    return array.astype(np.float64)


class QuantileForecaster(Family):
    name = "quantile_forecaster"
    Settings = ForecasterSettings
    naive = {"postprocess": "loop"}

    def __init__(self, settings: ForecasterSettings, model_dir: Path, channels_last: bool = False) -> None:
        super().__init__(settings, model_dir, channels_last)
        self.keys = [quantile_key(q) for q in settings.quantiles]
        if len(set(self.keys)) != len(self.keys):
            raise ConfigError(f"quantile_forecaster.quantiles: {list(settings.quantiles)} name the same percentile")

    # ---- one request -----------------------------------------------------------------------
    def decode(self, body: Any, content_type: str) -> Forecast:
        s = self.settings
        body = read_json(body, content_type, s.max_body_bytes, f"{_FORMS} as JSON")
        if not isinstance(body, dict):
            raise BadInput(f"expected a JSON object: {_FORMS}")
        if "series" not in body:
            window, options = self._series(body, "")
            return Forecast(window[None], (options,), several=False)
        if set(body) != {"series"}:
            raise BadInput(f"unknown field {sorted(set(body) - {'series'})[0]!r} beside 'series': {_FORMS}")
        series = body["series"]
        if not isinstance(series, list) or not series:
            raise BadInput("series: a non-empty list of {\"history\": [...]} objects")
        if len(series) > s.max_series:
            raise BadInput(f"series: {len(series)} series, over the limit of {s.max_series} per request")
        decoded = [self._series(one, f"series[{i}].") for i, one in enumerate(series)]
        return Forecast(np.stack([w for w, _ in decoded]), tuple(o for _, o in decoded), several=True)

    def _series(self, body: Any, at: str) -> tuple[np.ndarray, RowOptions]:
        s = self.settings
        if not isinstance(body, dict):
            raise BadInput(f"{at or 'body'}: a JSON object with 'history', got {type(body).__name__}")
        unknown = sorted(set(body) - set(_FIELDS))
        if unknown:
            raise BadInput(f"{at}{unknown[0]}: unknown field (known: {', '.join(_FIELDS)})")
        if "history" not in body:
            raise BadInput(f"{at}history: missing: {_FORMS}")
        history = _numbers(body["history"], f"{at}history", _MODEL_DTYPE)
        if not s.window <= len(history) <= s.max_history:
            raise BadInput(f"{at}history: {len(history)} values; the model reads the last {s.window}: send "
                           f"{s.window} to {s.max_history}")
        window = history[-s.window:]
        if s.min is not None:
            _within(history, window < s.min, f"{at}history", f"below min {s.min:g}")
        if s.max is not None:
            _within(history, window > s.max, f"{at}history", f"above max {s.max:g}")
        horizon = _integer(body.get("horizon", s.horizon), f"{at}horizon", 1, s.horizon)
        thresholds = _numbers(body.get("thresholds", []), f"{at}thresholds")
        if len(thresholds) > s.max_thresholds:
            raise BadInput(f"{at}thresholds: {len(thresholds)}, over the limit of {s.max_thresholds}")
        if "alert_within" in body and not len(thresholds):
            raise BadInput(f"{at}alert_within: given without thresholds")
        within = _integer(body.get("alert_within", horizon), f"{at}alert_within", 1, horizon)
        # The thresholds as the client wrote them, echoed in the alerts.
        echoed = tuple(body.get("thresholds", ()))
        return window.astype(_MODEL_DTYPE), RowOptions(horizon, echoed, within if len(echoed) else 0)

    # ---- a batch -----------------------------------------------------------------------------
    def collate(self, items: Sequence[Forecast]) -> ForecastBatch:
        windows = items[0].windows if len(items) == 1 else np.concatenate([f.windows for f in items])
        return ForecastBatch(torch.from_numpy(np.ascontiguousarray(windows)), tuple(items))

    def model_inputs(self, batch: Union[ForecastBatch, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        return (batch.windows,) if isinstance(batch, ForecastBatch) else (batch,)

    def postprocess(self, outputs: torch.Tensor, inputs: Union[ForecastBatch, torch.Tensor]) -> list[Any]:
        s = self.settings
        if outputs.dim() != 3 or outputs.shape[1] < s.horizon or outputs.shape[2] != len(s.quantiles):
            raise ServerFault(f"the model returned shape {list(outputs.shape)}; quantile_forecaster expects "
                              f"(rows, >= {s.horizon}, {len(s.quantiles)}): check the entry's settings")
        values = outputs[:, :s.horizon].float().cpu().numpy()
        if not isinstance(inputs, ForecastBatch):  # an example batch: full horizon, no thresholds
            forecasts = [Forecast(np.zeros(0), (RowOptions(s.horizon),), False)] * len(values)
        else:
            forecasts = inputs.forecasts
        options = [o for f in forecasts for o in f.options]
        rows = (forecast_rows_loop if s.postprocess == "loop" else forecast_rows)(values, options, self.keys,
                                                                                  s.min, s.max)
        answers, at = [], 0
        for f in forecasts:
            mine, at = rows[at:at + len(f.options)], at + len(f.options)
            answers.append({"series": mine} if f.several else mine[0])
        return answers

    def example_batch(self, size: int) -> torch.Tensor:
        """Random walks, above `min` when there is one (the model's input for warm-up and tracing)."""
        s = self.settings
        walks = np.random.default_rng(0).normal(0, 1, (size, s.window)).cumsum(axis=1)
        low = s.min if s.min is not None else 0.0
        top = s.max if s.max is not None else low + 100.0
        span = walks.max(axis=1, keepdims=True) - walks.min(axis=1, keepdims=True) + 1e-9
        walks = low + (walks - walks.min(axis=1, keepdims=True)) / span * (top - low) * 0.5 + (top - low) * 0.25
        return torch.from_numpy(walks.astype(np.float32))

    def gate_kind(self) -> str:
        return "tensor"

    @classmethod
    def bad_inputs(cls, settings: ForecasterSettings) -> list[Case]:
        return cls.stamped(forecaster_cases.cases(settings))

    @classmethod
    def answer_problem(cls, settings: ForecasterSettings, answer) -> Optional[str]:
        """Every declared quantile, `horizon` steps each, never crossing; alerts a list; per series."""
        series = answer.get("series", [answer]) if isinstance(answer, dict) else None
        if not isinstance(series, list) or not series:
            return f"expected a forecast or {{\"series\": [...]}}, got {str(answer)[:80]}"
        keys = [quantile_key(q) for q in settings.quantiles]
        for i, one in enumerate(series):
            if not isinstance(one, dict) or set(one) != {"horizon", "quantiles", "alerts"}:
                return f"series[{i}]: expected horizon, quantiles and alerts"
            table = one["quantiles"]
            if not isinstance(table, dict) or list(table) != keys or not isinstance(one["alerts"], list):
                return f"series[{i}]: quantiles {list(table) if isinstance(table, dict) else table} (expected {keys})"
            columns = list(table.values())
            if any(len(c) != one["horizon"] for c in columns):
                return f"series[{i}]: a quantile without {one['horizon']} steps"
            if not all(a <= b for low, high in zip(columns, columns[1:]) for a, b in zip(low, high)):
                return f"series[{i}]: quantiles cross"
        return None

    @classmethod
    def disagreement(cls, settings: ForecasterSettings, one, other) -> Optional[str]:
        """The same alerts and quantiles, values within 1e-5 relative."""
        a_series, b_series = one.get("series", [one]), other.get("series", [other])
        if len(a_series) != len(b_series):
            return f"{len(a_series)} vs {len(b_series)} series"
        for i, (a, b) in enumerate(zip(a_series, b_series)):
            if a["alerts"] != b["alerts"] or list(a["quantiles"]) != list(b["quantiles"]):
                return f"series[{i}]: alerts or quantile keys differ"
            x, y = (np.asarray(list(s["quantiles"].values()), dtype=np.float64) for s in (a, b))
            if x.shape != y.shape or not np.allclose(x, y, rtol=1e-5, atol=0):
                return f"series[{i}]: quantiles differ beyond 1e-5"
        return None
