"""The quantile forecaster's settings (settings.quantile_forecaster in the catalogue): read by the
family and by its cases."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from handlers.errors import ConfigError


@dataclass(frozen=True)
class ForecasterSettings:
    """settings.quantile_forecaster: what the model reads and returns, and the request limits."""

    window: int = 0  # values of history the model reads (required)
    horizon: int = 0  # steps it forecasts (required): a request may ask for fewer
    quantiles: tuple[float, ...] = ()  # the model's outputs, in order (required), e.g. [0.1, 0.5, 0.9]
    min: Optional[float] = None  # the series' range: history outside it is refused, forecasts clipped
    max: Optional[float] = None
    max_history: int = 100_000  # longest history accepted (only the last `window` values are read)
    max_series: int = 64  # series in one request
    max_thresholds: int = 16  # thresholds per series
    max_body_bytes: int = 8 * 1024 * 1024
    postprocess: Literal["vectorised", "loop"] = "vectorised"  # loop: the in-process benchmark's naive path

    def __post_init__(self) -> None:
        if self.window < 2 or self.horizon < 1:
            raise ConfigError(f"quantile_forecaster.window (>= 2) and .horizon (>= 1) are required, got "
                              f"{self.window} and {self.horizon}")
        q = self.quantiles
        if not q or any(not 0 < v < 1 for v in q) or any(a >= b for a, b in zip(q, q[1:])):
            raise ConfigError(f"quantile_forecaster.quantiles: increasing values in (0, 1), got {list(q)} "
                              "(e.g. [0.1, 0.5, 0.9])")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ConfigError(f"quantile_forecaster.min: {self.min} is above .max {self.max}")
        if self.max_history < self.window:
            raise ConfigError(f"quantile_forecaster.max_history: {self.max_history} is below window {self.window}")
        if min(self.max_series, self.max_body_bytes) < 1 or self.max_thresholds < 0:
            raise ConfigError("quantile_forecaster.max_series and .max_body_bytes must be >= 1, "
                              ".max_thresholds >= 0")
