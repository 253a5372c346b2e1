"""Train DigitsCNN on scikit-learn's digits (1797 real 8x8 scans; they install offline with the
wheel). `make build` calls `train(out)` when the catalogue's weights say `train:` this file, and
caches the weights by the content of this folder (build/training.py); it trains on one thread.

    .venv/bin/python -m models.digits.train      # trains into a temp folder, prints the accuracy,
                                                 # and writes labels.json and the example scans here
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from models.digits.digits_cnn import DigitsCNN

HERE = Path(__file__).resolve().parent
SEED = 20261122
EPOCHS = 30
HELD_OUT = 360


def _data():
    from sklearn.datasets import load_digits

    data = load_digits()
    images = data.images.astype(np.float32)[:, None]  # (1797, 1, 8, 8), values 0..16
    order = np.random.default_rng(SEED).permutation(len(images))
    return images, data.target, order[HELD_OUT:], order[:HELD_OUT]


def train(out: Path) -> dict:
    """Write out/weights.safetensors; return the held-out accuracy. Same seed, same weights."""
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
    images, targets, train_rows, test_rows = _data()
    x, y = torch.from_numpy(images), torch.from_numpy(targets).long()
    model = DigitsCNN()
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    for epoch in range(EPOCHS):
        model.train()
        for batch in torch.from_numpy(train_rows).split(64):
            optimiser.zero_grad()
            torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
            optimiser.step()
        if (epoch + 1) % 5 == 0:
            print(f"  digits: epoch {epoch + 1}/{EPOCHS} ({time.perf_counter() - started:.0f} s)", flush=True)
    model.eval()
    with torch.no_grad():
        accuracy = (model(x[test_rows]).argmax(1) == y[test_rows]).float().mean().item()
    save_file(model.state_dict(), str(Path(out) / "weights.safetensors"))
    return {"held_out_accuracy": round(accuracy, 4), "held_out": HELD_OUT, "epochs": EPOCHS, "seed": SEED}


def example_rows(targets: np.ndarray, test_rows: np.ndarray) -> list:
    """(digit, row) of the four example scans: the first held-out scan of each digit, in held-out order."""
    first: dict = {}
    for row in test_rows:
        first.setdefault(int(targets[row]), int(row))
    return list(first.items())[:4]


def write_examples() -> None:
    """The class names and four held-out scans (three .npy, one JSON) the catalogue entry uses."""
    images, targets, _, test_rows = _data()
    (HERE / "labels.json").write_text(json.dumps([str(d) for d in range(10)]) + "\n")
    chosen = example_rows(targets, test_rows)
    for digit, row in chosen[:3]:
        np.save(HERE / f"example_{digit}.npy", images[row])
    digit, row = chosen[3]
    (HERE / f"example_{digit}.json").write_text(json.dumps({"inputs": images[row].astype(int).tolist()}) + "\n")


def write_held_out() -> None:
    """held_out.npy: every held-out scan but the examples, for the build's accuracy gate."""
    images, targets, _, test_rows = _data()
    taken = {row for _, row in example_rows(targets, test_rows)}
    np.save(HERE / "held_out.npy", images[[row for row in test_rows if int(row) not in taken]])


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        print(train(Path(tmp)))
    write_examples()
    write_held_out()
