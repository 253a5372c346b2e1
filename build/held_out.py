"""The gate's held-out set stays apart from what it could be flattered by: the entry's examples
(what every tool sends, and what a model's author looks at) and its calibration set (what a
variant's settings were chosen on, e.g. the int8 layers kept in fp32).

Inputs are compared by content, not by file: a photo sent as a re-encoded JPEG example and held out
as its PNG file is one input (its source file's bytes are the key); a text is its stripped string
whether it comes from a .txt line or a {"text": ...} body; an array is its values whether it comes
from an .npy row or an {"inputs": ...} body; other JSON is its canonical form.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from build.examples import Example
from build.files import FileSource


@dataclass(frozen=True)
class Separation:
    """How many distinct inputs each set holds, and which held-out inputs repeat another set."""

    examples: int
    held_out: int
    calibration: int
    repeated_inside_held_out: int
    shared_with_examples: tuple[str, ...]
    shared_with_calibration: tuple[str, ...]

    @property
    def apart(self) -> bool:
        return not (self.repeated_inside_held_out or self.shared_with_examples or self.shared_with_calibration)

    def problem(self) -> str:
        parts = []
        if self.repeated_inside_held_out:
            parts.append(f"{self.repeated_inside_held_out} held-out input(s) repeated")
        if self.shared_with_examples:
            parts.append(f"held out and also an example: {', '.join(self.shared_with_examples[:3])}")
        if self.shared_with_calibration:
            parts.append(f"held out and also calibration: {', '.join(self.shared_with_calibration[:3])}")
        return "; ".join(parts)


def key(value: Any) -> str:
    """One input's content key (see the module docstring)."""
    if isinstance(value, dict) and set(value) == {"text"}:
        value = value["text"]
    if isinstance(value, dict) and set(value) == {"inputs"}:
        value = np.asarray(value["inputs"], dtype=np.float64)
    if isinstance(value, np.ndarray):
        data = b"array:" + np.ascontiguousarray(value, dtype=np.float64).tobytes()
    elif isinstance(value, str):
        data = b"text:" + value.strip().encode("utf-8")
    elif isinstance(value, (bytes, bytearray)):
        data = b"bytes:" + bytes(value)
    else:
        data = b"json:" + json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def file_inputs(path: Path) -> Iterable[tuple[str, Any]]:
    """(name, value) of each input a held-out or calibration file holds."""
    suffix = path.suffix.lower()
    if suffix == ".txt":
        lines = path.read_text(encoding="utf-8").splitlines()
        yield from ((f"{path.name}:{n}", line) for n, line in enumerate(lines, 1) if line.strip())
    elif suffix == ".jsonl":
        lines = path.read_text(encoding="utf-8").splitlines()
        yield from ((f"{path.name}:{n}", json.loads(line)) for n, line in enumerate(lines, 1) if line.strip())
    elif suffix == ".npy":
        yield from ((f"{path.name}[{n}]", row) for n, row in enumerate(np.load(path, allow_pickle=False)))
    elif suffix == ".json":
        yield path.name, json.loads(path.read_text(encoding="utf-8"))
    else:
        yield path.name, path.read_bytes()


def example_value(example: Example, root: Path) -> Any:
    """An example's content: its source file (before any re-encoding), or its inline JSON or text."""
    if example.file is None:
        return example.inline
    path = example.file.resolve(root, f"example {example.name}")
    if path.suffix.lower() in (".npy", ".json", ".jsonl", ".txt"):
        return next(iter(file_inputs(path)))[1]
    return path.read_bytes()


def separation(examples: Sequence[Example], held_out: Sequence[FileSource], calibration: Sequence[FileSource],
               root: Path, where: str) -> Separation:
    def inputs(files: Sequence[FileSource], what: str) -> list[tuple[str, str]]:
        return [(name, key(value)) for i, source in enumerate(files)
                for name, value in file_inputs(source.resolve(root, f"{where}.gate.{what}[{i}]"))]

    example_keys = {key(example_value(e, root)) for e in examples}
    held = inputs(held_out, "held_out")
    calibrated = {k for _, k in inputs(calibration, "calibration")}
    held_keys = [k for _, k in held]
    return Separation(
        examples=len(example_keys), held_out=len(set(held_keys)), calibration=len(calibrated),
        repeated_inside_held_out=len(held_keys) - len(set(held_keys)),
        shared_with_examples=tuple(name for name, k in held if k in example_keys),
        shared_with_calibration=tuple(name for name, k in held if k in calibrated),
    )

