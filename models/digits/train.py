"""Train DigitsCNN on scikit-learn's digits (installs offline with the wheel) and write the files
the catalogue entry `digits` uses: the weights, the class names and four held-out examples.

    .venv/bin/python -m models.digits.train      # about 10 s on 2 cores; same seed, same weights

Prints the held-out accuracy (the committed weights: see README).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from models.digits.digits_cnn import DigitsCNN

HERE = Path(__file__).resolve().parent
SEED = 20261122
EPOCHS = 30


def main() -> float:
    from safetensors.torch import save_file
    from sklearn.datasets import load_digits

    torch.manual_seed(SEED)
    data = load_digits()
    images = data.images.astype(np.float32)[:, None]  # (1797, 1, 8, 8), 0..16
    order = np.random.default_rng(SEED).permutation(len(images))
    test, train = order[:360], order[360:]
    x, y = torch.from_numpy(images), torch.from_numpy(data.target).long()
    model = DigitsCNN()
    optimiser = torch.optim.Adam(model.parameters(), lr=3e-3)
    for epoch in range(EPOCHS):
        model.train()
        for batch in torch.from_numpy(train).split(64):
            optimiser.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
            loss.backward()
            optimiser.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(x[test]).argmax(1) == y[test]).float().mean().item()
    save_file(model.state_dict(), str(HERE / "digits_cnn.safetensors"))
    (HERE / "labels.json").write_text(json.dumps([str(d) for d in range(10)]) + "\n")
    shown = {}
    for index in test:  # the first held-out scan of three different digits
        shown.setdefault(int(data.target[index]), index)
    for digit, index in list(shown.items())[:3]:
        np.save(HERE / f"example_{digit}.npy", images[index])
    digit, index = list(shown.items())[3]  # one more as JSON, the form most clients send
    (HERE / f"example_{digit}.json").write_text(json.dumps({"inputs": images[index].astype(int).tolist()}) + "\n")
    print(f"held-out accuracy {accuracy:.3f} on {len(test)} digits")
    return accuracy


if __name__ == "__main__":
    main()
