"""The accuracy gate: a variant's answers against the fp32 eager model's, on the entry's examples and
its held-out set, judged the way its family's answers are used.

    gate:
      held_out: [{path: models/minilm/held_out.txt}]   # .txt: a text request per line; .npy: a row;
                                                       # .jsonl: a JSON request per line
      min_cosine: 0.99      # embeddings: every input's cosine to fp32's
      calibration: [{path: models/minilm/calibration.txt}]   # what a variant's settings were chosen on:
                            #   never gated on, and kept apart from held_out (build/held_out.py)
      top1_margin: 0.05     # classes: top-1 equal to fp32's where fp32's top-1 leads its top-2 by
                            #   this much (probability), else within fp32's top-2
      atol: 0.001           # raw tensors: |variant - fp32| <= atol + rtol * |fp32|, element-wise
      rtol: 0.01
      self_check: 5         # held-out inputs packed into each archive, where the variant came nearest to
                            #   the bound, with fp32's outputs: the worker checks itself on them at load
                            #   (handlers/self_check.py); 0: none

Inputs go through the family's own decode and collate (exactly what a request becomes in the worker).
The measures are handlers/self_check.py's `agreement`: the worker's self-check judges the same way.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from build.errors import CatalogueError
from build.examples import CONTENT_TYPES, Example, worker_input
from build.files import FileSource, only_keys
from handlers import runtime
from handlers.errors import HandlerError
from handlers.families import Family
from handlers.self_check import Bounds, agreement

GATE_BATCH = 8
MAX_SELF_CHECK = 32  # inputs: the self-check runs them one by one while the worker loads


@dataclass(frozen=True)
class GateSpec:
    held_out: tuple[FileSource, ...] = ()
    calibration: tuple[FileSource, ...] = ()
    min_cosine: float = 0.99
    top1_margin: float = 0.05
    atol: float = 1e-3
    rtol: float = 1e-2
    self_check: int = 5

    @property
    def bounds(self) -> Bounds:
        return Bounds(self.min_cosine, self.top1_margin, self.atol, self.rtol)

    @classmethod
    def parse(cls, where: str, raw: Any) -> GateSpec:
        raw = raw or {}
        only_keys(where, raw, ("held_out", "calibration", "min_cosine", "top1_margin", "atol", "rtol", "self_check"))
        lists = {}
        for name in ("held_out", "calibration"):
            files = raw.get(name, [])
            if not isinstance(files, list):
                raise CatalogueError(f"{where}.{name}: a list of files (path, or package + file)")
            lists[name] = tuple(FileSource.parse(f"{where}.{name}[{i}]", f) for i, f in enumerate(files))
        numbers = {}
        for key, low, high in (("min_cosine", -1.0, 1.0), ("top1_margin", 0.0, 1.0), ("atol", 0.0, None),
                               ("rtol", 0.0, None)):
            value = raw.get(key, getattr(cls, key))
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low or (
                    high is not None and value > high):
                raise CatalogueError(f"{where}.{key}: a number in [{low}, {high if high is not None else 'inf'}], "
                                     f"got {value!r}")
            numbers[key] = float(value)
        count = raw.get("self_check", cls.self_check)
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_SELF_CHECK:
            raise CatalogueError(f"{where}.self_check: how many held-out inputs the worker checks itself on at "
                                 f"load, an integer in [0, {MAX_SELF_CHECK}], got {count!r}")
        return cls(**lists, **numbers, self_check=count)


@dataclass(frozen=True)
class GateInput:
    name: str  # for messages: the example's name, or file:line
    body: Any  # what the worker hands the family
    content_type: str
    held_out: bool = False  # from gate.held_out (else an example)


@dataclass(frozen=True)
class Verdict:
    """The gate's judgement of one variant: its worst input, by the family's measure."""

    passed: bool
    measure: str  # "min cosine", "top-1 agreement", "max tolerance ratio"
    worst: float
    threshold: float
    worst_input: str
    inputs: int
    order: tuple[int, ...] = ()  # input indices, the nearest to failing first

    @property
    def summary(self) -> str:
        sign = ">=" if self.measure != "max tolerance ratio" else "<="
        verdict = "passed" if self.passed else "FAILED"
        # Every input agreeing, the classes' "worst" is the closest call: fp32's smallest top-1 lead.
        which = "closest call" if self.passed and self.measure == "top-1 agreement" else "worst"
        return (f"{verdict}: {self.measure} {self.worst:.4f} (needs {sign} {self.threshold:g}) over {self.inputs} "
                f"inputs, {which} {self.worst_input}")


def gate_inputs(examples: Sequence[Example], spec: GateSpec, root: Path, where: str) -> tuple[GateInput, ...]:
    inputs: list[GateInput] = []
    for example in examples:
        request = example.request(root)
        inputs.append(GateInput(example.name, worker_input(request.body, request.content_type), request.content_type))
    for i, source in enumerate(spec.held_out):
        path = source.resolve(root, f"{where}.gate.held_out[{i}]")
        suffix = path.suffix.lower()
        if suffix == ".txt":
            lines = path.read_text(encoding="utf-8").splitlines()
            inputs.extend(GateInput(f"{path.name}:{n}", line, "text/plain", True)
                          for n, line in enumerate(lines, 1) if line.strip())
        elif suffix == ".jsonl":
            lines = path.read_text(encoding="utf-8").splitlines()
            inputs.extend(GateInput(f"{path.name}:{n}", json.loads(line), "application/json", True)
                          for n, line in enumerate(lines, 1) if line.strip())
        elif suffix == ".npy":
            stack = np.load(path, allow_pickle=False)
            inputs.extend(GateInput(f"{path.name}[{n}]", {"inputs": row.tolist()}, "application/json", True)
                          for n, row in enumerate(stack))
        elif suffix in CONTENT_TYPES:
            inputs.append(GateInput(path.name, path.read_bytes(), CONTENT_TYPES[suffix], True))
        else:
            raise CatalogueError(f"{where}.gate.held_out[{i}]: {path.name}: a .txt (a text per line), a .jsonl (a "
                                 f"JSON request per line), an .npy (an item per row) or one of "
                                 f"{', '.join(CONTENT_TYPES)}")
    return tuple(inputs)


def run_outputs(model: Callable, family: Family, inputs: Sequence[GateInput],
                autocast_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """The model's raw outputs for every input, in batches the way the worker collates them, under the
    autocast the worker runs it with (none for fp32 and for graphs that carry their precision)."""
    items = []
    for item in inputs:
        try:
            items.append(family.decode(item.body, item.content_type))
        except HandlerError as err:
            raise CatalogueError(f"gate input {item.name} is refused by the model: {err.message}") from None
    outputs = []
    with torch.inference_mode(), runtime.autocast(torch.device("cpu"), autocast_dtype):
        for start in range(0, len(items), GATE_BATCH):
            batch = family.collate(items[start:start + GATE_BATCH])
            out = model(*family.model_inputs(batch))
            outputs.append(out.float())
    return torch.cat(outputs)


def row_owners(family: Family, inputs: Sequence[GateInput]) -> tuple[int, ...]:
    """The input each output row is of: a request may hold several items (a forecaster's two series)."""
    owners: list[int] = []
    for index, item in enumerate(inputs):
        batch = family.collate([family.decode(item.body, item.content_type)])
        owners.extend([index] * family.model_inputs(batch)[0].shape[0])
    return tuple(owners)


def judge(kind: str, spec: GateSpec, reference: torch.Tensor, candidate: torch.Tensor,
          inputs: Sequence[GateInput], owners: Sequence[int] = ()) -> Verdict:
    """The family's measure per output row (handlers/self_check.py's `agreement`), and the worst;
    `owners`: the input each row is of (row_owners; by default one row per input)."""
    if reference.shape != candidate.shape:
        return Verdict(False, "output shape", 0.0, 0.0, f"{tuple(candidate.shape)} vs {tuple(reference.shape)}",
                       len(inputs))
    owners = tuple(owners) or tuple(range(reference.shape[0]))
    found = agreement(kind, spec.bounds, reference, candidate)
    row = found.worst
    name = inputs[owners[row]].name if owners[row] < len(inputs) else f"output row {row}"
    if found.measure == "top-1 agreement":
        name = f"{name} (top-1 {int(candidate[row].argmax())} vs fp32's {int(reference[row].argmax())})"
    order = found.by_input(owners).order if len(owners) == reference.shape[0] and max(owners) < len(inputs) else ()
    return Verdict(found.passed, found.measure, found.figure, found.threshold, name, len(inputs), order)


def self_check_inputs(verdict: Verdict, inputs: Sequence[GateInput], count: int) -> tuple[GateInput, ...]:
    """The `count` held-out inputs on which the variant came nearest to the gate's bound (the
    entry's examples when it holds nothing out)."""
    pool = [i for i in verdict.order if inputs[i].held_out] or list(verdict.order)
    return tuple(inputs[i] for i in pool[:count])
