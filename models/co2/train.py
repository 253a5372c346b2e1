"""Train QuantileMLP on the weekly atmospheric CO2 of Mauna Loa, 1958-2001 (2,284 weeks; it
installs offline with statsmodels' wheel). `make build` calls `train(out)` when the catalogue's
weights say `train:` this file, and caches the weights by the content of this folder
(build/training.py); it trains on one thread.

Held out: the last 8 years (forecasts that start after the training data ends, gap included).
Reported on them, against the seasonal-naive baseline (the same week a year earlier, with the
quantiles of its training residuals per horizon step): the mean pinball loss and how often the
truth falls between p10 and p90 (80% for a calibrated forecaster).

    .venv/bin/python -m models.co2.train     # trains into a temp folder, prints the figures,
                                             # and writes the example requests here
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from models.co2.quantile_mlp import QuantileMLP

HERE = Path(__file__).resolve().parent
SEED = 20261123
WINDOW, HORIZON, SEASON = 156, 52, 52
QUANTILES = (0.1, 0.5, 0.9)
HELD_OUT_WEEKS = 8 * 52
STEPS, BATCH = 500, 128


def weekly_co2() -> np.ndarray:
    """The series in ppm; its 59 missing weeks filled by linear interpolation between neighbours."""
    from statsmodels.datasets import co2

    return co2.load_pandas().data["co2"].interpolate().to_numpy(np.float32)


def windows(series: np.ndarray, first: int, last: int):
    """(history, future) pairs whose forecasts start in [first, last)."""
    starts = np.arange(max(first, WINDOW), min(last, len(series) - HORIZON + 1))
    history = np.stack([series[s - WINDOW:s] for s in starts])
    future = np.stack([series[s:s + HORIZON] for s in starts])
    return history, future


def split(series: np.ndarray):
    """Training forecasts end before the held-out years begin; held-out ones start after them."""
    boundary = len(series) - HELD_OUT_WEEKS
    return windows(series, WINDOW, boundary - HORIZON + 1), windows(series, boundary, len(series))


def pinball(prediction: np.ndarray, truth: np.ndarray) -> float:
    """Mean pinball loss over every step and quantile: prediction (N, H, Q), truth (N, H)."""
    q = np.asarray(QUANTILES, np.float32)
    error = truth[..., None] - prediction
    return float(np.mean(np.maximum(q * error, (q - 1) * error)))


def coverage(prediction: np.ndarray, truth: np.ndarray) -> float:
    """How often the truth lies between the lowest and the highest quantile."""
    return float(np.mean((truth >= prediction[..., 0]) & (truth <= prediction[..., -1])))


def seasonal_naive(history: np.ndarray, train_history: np.ndarray, train_future: np.ndarray) -> np.ndarray:
    """The same week a year earlier, plus the quantiles of that forecast's training residuals per step."""
    def point(h: np.ndarray) -> np.ndarray:
        return h[:, -SEASON:][:, np.arange(HORIZON) % SEASON]

    residuals = train_future - point(train_history)
    offsets = np.quantile(residuals, QUANTILES, axis=0).T  # (H, Q)
    return point(history)[..., None] + offsets[None]


def train(out: Path) -> dict:
    """Write out/weights.safetensors; return the held-out figures. Same seed, same weights."""
    threads = torch.get_num_threads()
    # One thread: a model this small loses more to hand-offs between threads than a second one
    # gains, and far more when other jobs share the cores.
    torch.set_num_threads(1)
    try:
        return _train(Path(out))
    finally:
        torch.set_num_threads(threads)


def _train(out: Path) -> dict:
    from safetensors.torch import save_file

    torch.manual_seed(SEED)
    started = time.perf_counter()
    (train_history, train_future), (test_history, test_future) = split(weekly_co2())
    x, y = torch.from_numpy(train_history), torch.from_numpy(train_future)
    q = torch.tensor(QUANTILES)
    model = QuantileMLP(WINDOW, HORIZON, len(QUANTILES))
    optimiser = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, STEPS)
    rows = torch.Generator().manual_seed(SEED)
    for step in range(STEPS):
        batch = torch.randint(0, len(x), (BATCH,), generator=rows)
        error = y[batch].unsqueeze(-1) - model(x[batch])
        # Pinball loss in units of each window's own spread, so every window counts alike.
        spread = (x[batch, 1:] - x[batch, :-1]).abs().mean(dim=1).clamp_min(1e-6)[:, None, None]
        loss = torch.maximum(q * error, (q - 1) * error).div(spread).mean()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        schedule.step()
        if (step + 1) % 100 == 0:
            print(f"  co2: step {step + 1}/{STEPS}, loss {loss.item():.3f} ({time.perf_counter() - started:.0f} s)",
                  flush=True)
    model.eval()
    with torch.no_grad():
        forecast = np.sort(model(torch.from_numpy(test_history)).numpy(), axis=-1)
    naive = seasonal_naive(test_history, train_history, train_future)
    save_file(model.state_dict(), str(Path(out) / "weights.safetensors"))
    return {
        "held_out_forecasts": len(test_history), "held_out_weeks": HELD_OUT_WEEKS,
        "pinball_ppm": round(pinball(forecast, test_future), 4),
        "pinball_ppm_seasonal_naive": round(pinball(naive, test_future), 4),
        "coverage_p10_p90": round(coverage(forecast, test_future), 4),
        "coverage_p10_p90_seasonal_naive": round(coverage(naive, test_future), 4),
        "steps": STEPS, "seed": SEED,
    }


def write_examples() -> None:
    """Three held-out requests the catalogue entry uses: a plain one, one with thresholds, and two series."""
    (_, _), (history, _) = split(weekly_co2())
    latest, earlier = (history[i].astype(np.float64).round(2).tolist() for i in (-1, 0))
    (HERE / "example_latest.json").write_text(json.dumps({"history": latest, "horizon": HORIZON}) + "\n")
    (HERE / "example_alert.json").write_text(json.dumps(
        {"history": latest, "horizon": 26, "thresholds": [371.0, 372.5], "alert_within": 26}) + "\n")
    (HERE / "example_two_series.json").write_text(json.dumps(
        {"series": [{"history": earlier, "horizon": 13}, {"history": latest, "horizon": 13}]}) + "\n")


def write_held_out(every: int = 4) -> None:
    """held_out.jsonl: every `every`-th held-out history but the examples' two (the first and the
    last), one request per line, for the build's accuracy gate."""
    (_, _), (history, _) = split(weekly_co2())
    rows = range(every, len(history) - 1, every)
    lines = [json.dumps({"history": history[i].astype(np.float64).round(2).tolist()}) for i in rows]
    (HERE / "held_out.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        print(train(Path(tmp)))
    write_examples()
    write_held_out()
