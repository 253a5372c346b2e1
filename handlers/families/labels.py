"""Class labels and top-k answers, shared by the families that classify."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import torch

from handlers.errors import ConfigError


def load_labels(path: Path) -> list[str]:
    """Class names by index: a JSON list, or {"index": "name, synonym, ..."} (first synonym kept).

    ImageNet repeats a few names ("crane" the bird and the machine): those get their class index
    appended, so every label, used as a key of the response, stays unique.
    """
    raw = json.loads(path.read_text(encoding="utf-8"))
    full = raw if isinstance(raw, list) else [raw[str(i)] for i in range(len(raw))]
    short = [str(name).split(",")[0].strip() for name in full]
    repeated = {name for name in short if short.count(name) > 1}
    return [f"{name} ({i})" if name in repeated else name for i, name in enumerate(short)]


def class_names(labels: Optional[list[str]], classes: int, where: str) -> list[str]:
    """The labels for a model with `classes` outputs (their indices when there are none)."""
    if labels is None:
        return [str(i) for i in range(classes)]
    if len(labels) != classes:
        raise ConfigError(f"{where}.labels: {len(labels)} names for a model with {classes} outputs")
    return labels


def top_k(outputs: torch.Tensor, labels: list[str], k: int) -> list[dict]:
    """{label: probability} of the k most likely classes per row, highest first (softmax over the row)."""
    probabilities, indices = outputs.float().softmax(dim=-1).topk(min(k, outputs.shape[-1]), dim=-1)
    return [{labels[i]: round(p, 6) for p, i in zip(row_p, row_i)}
            for row_p, row_i in zip(probabilities.tolist(), indices.tolist())]


def top_k_problem(answer: Any, k: int) -> Optional[str]:
    """What is wrong with a {label: probability} answer of at most k classes, or None."""
    if not isinstance(answer, dict) or not 1 <= len(answer) <= k:
        return f"expected 1..{k} {{label: probability}} pairs, got {str(answer)[:80]}"
    bad = [label for label, p in answer.items() if not isinstance(p, float) or not 0 <= p <= 1]
    return f"probabilities outside [0, 1]: {bad[:3]}" if bad else None


def top_k_disagreement(one: dict, other: dict) -> Optional[str]:
    """Two top-k answers agree: the same top-1, and every label both name within 1e-3."""
    if not one or not other or next(iter(one)) != next(iter(other)):
        return f"top-1 {next(iter(one), None)!r} vs {next(iter(other), None)!r}"
    far = [k for k in set(one) & set(other) if abs(one[k] - other[k]) > 1e-3]
    return f"probabilities differ by more than 1e-3 for {sorted(far)[:3]}" if far else None
