"""A small CNN for 8x8 greyscale digits (scikit-learn's digits: 1797 real scans, values 0..16).

A user's own model, as the README's "Serve your own model" shows: a plain nn.Module in a file of
the repository; the catalogue names the file, the class, its arguments and the weights.
"""

import torch
from torch import nn


class DigitsCNN(nn.Module):
    def __init__(self, width: int = 16, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(2 * width * 4 * 4, classes)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """(N, 1, 8, 8) values 0..16 -> (N, classes) logits."""
        return self.head(self.features(pixels / 16.0).flatten(1))
