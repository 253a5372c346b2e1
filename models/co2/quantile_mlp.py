"""A small multi-horizon quantile forecaster: an MLP over a window of one series.

The model owns its scaling: each window is centred on its last value and divided by its own
spread, so one set of weights serves series of any level (a user's own metric, not only CO2).
Input (N, window) raw values; output (N, horizon, quantiles) in the same units, quantiles in the
order of the catalogue's `quantile_forecaster.quantiles` (they may cross: the family sorts them).
"""

import torch
from torch import nn


class QuantileMLP(nn.Module):
    def __init__(self, window: int = 156, horizon: int = 52, quantiles: int = 3, hidden: int = 128):
        super().__init__()
        self.horizon, self.quantiles = horizon, quantiles
        self.body = nn.Sequential(
            nn.Linear(window, hidden), nn.GELU(),
            nn.Linear(hidden, hidden), nn.GELU(),
            nn.Linear(hidden, horizon * quantiles),
        )

    def forward(self, history: torch.Tensor) -> torch.Tensor:
        level = history[:, -1:]
        # The spread of the window's steps, not of its values: a trend does not inflate it.
        scale = (history[:, 1:] - history[:, :-1]).abs().mean(dim=1, keepdim=True).clamp_min(1e-6)
        out = self.body((history - level) / scale)
        return out.view(-1, self.horizon, self.quantiles) * scale.unsqueeze(-1) + level.unsqueeze(-1)
