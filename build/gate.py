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

Inputs go through the family's own decode and collate (exactly what a request becomes in the worker).
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

GATE_BATCH = 8


@dataclass(frozen=True)
class GateSpec:
    held_out: tuple[FileSource, ...] = ()
    calibration: tuple[FileSource, ...] = ()
    min_cosine: float = 0.99
    top1_margin: float = 0.05
    atol: float = 1e-3
    rtol: float = 1e-2

    @classmethod
    def parse(cls, where: str, raw: Any) -> GateSpec:
        raw = raw or {}
        only_keys(where, raw, ("held_out", "calibration", "min_cosine", "top1_margin", "atol", "rtol"))
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
        return cls(**lists, **numbers)


@dataclass(frozen=True)
class GateInput:
    name: str  # for messages: the example's name, or file:line
    body: Any  # what the worker hands the family
    content_type: str


@dataclass(frozen=True)
class Verdict:
    """The gate's judgement of one variant: its worst input, by the family's measure."""

    passed: bool
    measure: str  # "min cosine", "top-1 agreement", "max tolerance ratio"
    worst: float
    threshold: float
    worst_input: str
    inputs: int

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
            inputs.extend(GateInput(f"{path.name}:{n}", line, "text/plain")
                          for n, line in enumerate(lines, 1) if line.strip())
        elif suffix == ".jsonl":
            lines = path.read_text(encoding="utf-8").splitlines()
            inputs.extend(GateInput(f"{path.name}:{n}", json.loads(line), "application/json")
                          for n, line in enumerate(lines, 1) if line.strip())
        elif suffix == ".npy":
            stack = np.load(path, allow_pickle=False)
            inputs.extend(GateInput(f"{path.name}[{n}]", {"inputs": row.tolist()}, "application/json")
                          for n, row in enumerate(stack))
        elif suffix in CONTENT_TYPES:
            inputs.append(GateInput(path.name, path.read_bytes(), CONTENT_TYPES[suffix]))
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


def judge(kind: str, spec: GateSpec, reference: torch.Tensor, candidate: torch.Tensor,
          inputs: Sequence[GateInput]) -> Verdict:
    """The family's measure per input, and the worst."""
    if reference.shape != candidate.shape:
        return Verdict(False, "output shape", 0.0, 0.0, f"{tuple(candidate.shape)} vs {tuple(reference.shape)}",
                       len(inputs))
    if kind == "embedding":
        cos = torch.nn.functional.cosine_similarity(reference.flatten(1), candidate.flatten(1), dim=1)
        cos = torch.nan_to_num(cos, nan=-1.0)
        worst = int(cos.argmin())
        return Verdict(bool(cos.min() >= spec.min_cosine), "min cosine", float(cos[worst]), spec.min_cosine,
                       inputs[worst].name, len(inputs))
    if kind == "classification":
        ok, score = classes_agree(reference, candidate, spec.top1_margin)
        worst = int(np.argmin(score))
        return Verdict(bool(ok.all()), "top-1 agreement", float(ok.mean()), 1.0,
                       f"{inputs[worst].name} (top-1 {int(candidate[worst].argmax())} vs fp32's "
                       f"{int(reference[worst].argmax())})", len(inputs))
    bound = spec.atol + spec.rtol * reference.abs()
    ratio = ((candidate - reference).abs() / bound).flatten(1).max(dim=1).values
    ratio = torch.nan_to_num(ratio, nan=float("inf"))
    worst = int(ratio.argmax())
    return Verdict(bool(ratio.max() <= 1.0), "max tolerance ratio", float(ratio[worst]), 1.0,
                   inputs[worst].name, len(inputs))


def classes_agree(reference: torch.Tensor, candidate: torch.Tensor, margin: float) -> tuple[np.ndarray, np.ndarray]:
    """Per input: does the candidate's top-1 pass (fp32's top-1 where fp32 leads by >= margin, else
    one of fp32's top-2); and a score to find the worst (lower is worse)."""
    probs = torch.softmax(reference.flatten(1), dim=1)
    top2 = probs.topk(2, dim=1)
    lead = (top2.values[:, 0] - top2.values[:, 1]).numpy()
    mine = candidate.flatten(1).argmax(dim=1).numpy()
    first, second = top2.indices[:, 0].numpy(), top2.indices[:, 1].numpy()
    ok = np.where(lead >= margin, mine == first, (mine == first) | (mine == second))
    score = np.where(ok, 1.0 + lead, lead - 1.0)  # failures first, the closest calls next
    return ok, score
