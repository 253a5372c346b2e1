"""A variant proves itself on the machine that serves it.

The build's accuracy gate (build/gate.py) judges a variant on the build host's CPU, and the same
int8 graph can answer differently on another one: ONNX Runtime and fbgemm choose their int8 kernels
by the CPU's instructions (AMX, AVX-512 VNNI, AVX-VNNI or plain AVX2). So the build packs into
every gated archive a few held-out inputs (those where the variant came nearest to the gate's bound)
with the fp32 eager model's outputs for them (`self_check.json`), and at load the worker runs the
variant on them, as one batch through the family's decode and collate, and measures the answers
with the gate's own measure (`agreement`, which the gate uses too). Below the gate's bound the
worker refuses to load (a ConfigError naming the model, the variant, the figure, the bound and the
fix); the time it took is logged either way.

    self_check.json: {"model", "variant", "kind", "bounds": {min_cosine, top1_margin, atol, rtol},
                      "built_on", "build_figure",
                      "inputs": [{"name", "content_type", "form": "text" | "json" | "base64", "body"}],
                      "reference": [the fp32 output of each input, as nested lists]}
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from handlers.errors import ConfigError, HandlerError

log = logging.getLogger(__name__)

FILE = "self_check.json"
# The CPU features that decide which int8 kernels run, best first: part of where a verdict holds.
INT8_FEATURES = ("amx_int8", "avx512_vnni", "avx_vnni", "avx512_bw", "avx2")


@dataclass(frozen=True)
class Bounds:
    """The gate's bounds, per kind of output (build/gate.py's GateSpec holds the entry's)."""

    min_cosine: float = 0.99  # embeddings: every input's cosine to fp32's
    top1_margin: float = 0.05  # classes: fp32's top-1 where it leads by this much, else its top-2
    atol: float = 1e-3  # raw tensors: |variant - fp32| <= atol + rtol * |fp32|
    rtol: float = 1e-2


@dataclass(frozen=True)
class Agreement:
    """A variant's outputs against fp32's, input by input, by its kind's measure."""

    measure: str  # "min cosine" | "top-1 agreement" | "max tolerance ratio" | "output shape"
    figure: float  # over all inputs: the worst cosine, the share agreeing, the worst ratio
    threshold: float
    ok: np.ndarray  # per input: within the bound
    rank: np.ndarray  # per input: lower is nearer to failing

    @property
    def passed(self) -> bool:
        return bool(self.ok.size) and bool(self.ok.all())

    @property
    def worst(self) -> int:
        return int(np.argmin(self.rank))

    @property
    def order(self) -> tuple[int, ...]:
        """Input indices, the nearest to failing first."""
        return tuple(int(i) for i in np.argsort(self.rank, kind="stable"))

    @property
    def bound(self) -> str:
        return f"{'<=' if self.measure == 'max tolerance ratio' else '>='} {self.threshold:g}"

    def by_input(self, owners: Sequence[int]) -> Agreement:
        """Per input instead of per output row (a request may hold several items: two series, say):
        an input is within the bound when all its rows are, as near to failing as its worst row."""
        if len(owners) != len(self.ok):
            return self
        owners = np.asarray(owners, dtype=np.int64)
        inputs = int(owners.max()) + 1 if owners.size else 0
        ok, rank = np.ones(inputs, bool), np.full(inputs, np.inf)
        np.logical_and.at(ok, owners, self.ok)
        np.minimum.at(rank, owners, self.rank)
        return replace(self, ok=ok, rank=rank)


def agreement(kind: str, bounds: Bounds, reference: torch.Tensor, candidate: torch.Tensor) -> Agreement:
    """The gate's measure: cosine for embeddings, top-1 for classes, a tolerance for tensors."""
    rows = reference.shape[0]
    if reference.shape != candidate.shape:
        return Agreement("output shape", 0.0, 1.0, np.zeros(rows, bool), np.zeros(rows))
    reference, candidate = reference.float(), candidate.float()
    if kind == "embedding":
        cos = torch.nn.functional.cosine_similarity(reference.flatten(1), candidate.flatten(1), dim=1)
        cos = torch.nan_to_num(cos, nan=-1.0).numpy()
        return Agreement("min cosine", float(cos.min()), bounds.min_cosine, cos >= bounds.min_cosine, cos)
    if kind == "classification":
        ok, score = classes_agree(reference, candidate, bounds.top1_margin)
        return Agreement("top-1 agreement", float(ok.mean()), 1.0, ok, score)
    limit = bounds.atol + bounds.rtol * reference.abs()
    ratio = ((candidate - reference).abs() / limit).flatten(1).max(dim=1).values
    ratio = torch.nan_to_num(ratio, nan=float("inf")).numpy()
    return Agreement("max tolerance ratio", float(ratio.max()), 1.0, ratio <= 1.0, -ratio)


def classes_agree(reference: torch.Tensor, candidate: torch.Tensor, margin: float) -> tuple[np.ndarray, np.ndarray]:
    """Per input: does the candidate's top-1 pass (fp32's top-1 where fp32 leads by >= margin, else
    one of fp32's top-2); and a score to rank them (lower is worse: failures, then the closest calls)."""
    probs = torch.softmax(reference.flatten(1), dim=1)
    top2 = probs.topk(2, dim=1)
    lead = (top2.values[:, 0] - top2.values[:, 1]).numpy()
    mine = candidate.flatten(1).argmax(dim=1).numpy()
    first, second = top2.indices[:, 0].numpy(), top2.indices[:, 1].numpy()
    ok = np.where(lead >= margin, mine == first, (mine == first) | (mine == second))
    return ok, np.where(ok, 1.0 + lead, lead - 1.0)


def int8_features() -> tuple[str, ...]:
    """Which of INT8_FEATURES this CPU has."""
    capabilities = torch.cpu.get_capabilities()
    return tuple(name for name in INT8_FEATURES if capabilities.get(name))


def host() -> str:
    """This CPU and its int8 instructions, e.g. "Intel Xeon (amx_int8, avx512_vnni, ...)"."""
    name = torch.cpu.get_capabilities().get("cpu_name") or "unknown CPU"
    return f"{name} ({', '.join(int8_features()) or 'no AVX2'})"


@dataclass(frozen=True)
class Packed:
    """One input as the worker hands it to the family: text, parsed JSON or raw bytes."""

    name: str
    content_type: str
    body: Any

    def to_json(self) -> dict:
        if isinstance(self.body, str):
            return {"name": self.name, "content_type": self.content_type, "form": "text", "body": self.body}
        if isinstance(self.body, (bytes, bytearray)):
            return {"name": self.name, "content_type": self.content_type, "form": "base64",
                    "body": base64.b64encode(bytes(self.body)).decode("ascii")}
        return {"name": self.name, "content_type": self.content_type, "form": "json", "body": self.body}

    @classmethod
    def from_json(cls, data: dict) -> Packed:
        body = base64.b64decode(data["body"]) if data["form"] == "base64" else data["body"]
        return cls(data["name"], data["content_type"], body)


def outputs(inputs: Sequence[Packed], family, infer: Callable) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The inputs decoded, collated as one batch (the same batch at build and at load: a dynamic int8
    answer depends on its batch-mates) and run by `infer` (the worker's forward pass), on the host as
    float32; and the input each output row is of (a request may hold several items)."""
    decoded, owners = [], []
    for index, item in enumerate(inputs):
        try:
            decoded.append(family.decode(item.body, item.content_type))
        except HandlerError as err:
            raise ConfigError(f"self-check input {item.name} is refused by the model: {err.message}") from None
        owners.extend([index] * family.model_inputs(family.collate(decoded[-1:]))[0].shape[0])
    return infer(family.collate(decoded)).detach().float().cpu(), tuple(owners)


@dataclass(frozen=True)
class SelfCheck:
    """What the build packs: the inputs, fp32's outputs for them, the bound, where it was built."""

    model: str
    variant: str
    kind: str  # the family's gate kind: embedding | classification | tensor
    bounds: Bounds
    inputs: tuple[Packed, ...]
    reference: torch.Tensor
    built_on: str
    build_figure: float  # this check's figure on the build host

    def to_json(self) -> dict:
        return {"model": self.model, "variant": self.variant, "kind": self.kind, "bounds": asdict(self.bounds),
                "built_on": self.built_on, "build_figure": self.build_figure,
                "inputs": [item.to_json() for item in self.inputs], "reference": self.reference.tolist()}

    @classmethod
    def read(cls, path: Path) -> SelfCheck:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            return cls(data["model"], data["variant"], data["kind"], Bounds(**data["bounds"]),
                       tuple(Packed.from_json(item) for item in data["inputs"]),
                       torch.tensor(data["reference"], dtype=torch.float32), data["built_on"],
                       float(data["build_figure"]))
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"{path.name}: unreadable ({type(err).__name__}: {err}): rebuild the archive "
                              "(make build)") from None

    def measure(self, family, infer: Callable) -> Agreement:
        """Per input: the variant's outputs here against the packed fp32 ones. A TorchScript graph runs
        unfused: its profiling executor would otherwise spend its shape specialisations, and seconds
        of fusion compiles, on these batch-1 shapes before warm-up (the kernels whose numerics depend
        on the CPU, int8 and reduced precision, are the same ones either way)."""
        with torch.jit.optimized_execution(False):
            found, owners = outputs(self.inputs, family, infer)
        return agreement(self.kind, self.bounds, self.reference, found).by_input(owners)

    def summary(self, found: Agreement) -> str:
        worst = self.inputs[found.worst].name if found.worst < len(self.inputs) else f"output row {found.worst}"
        return (f"{found.measure} {found.figure:.4f} (needs {found.bound}) on {len(self.inputs)} held-out "
                f"input(s), worst {worst}")


def verify(model_dir: Path, model: str, variant: str, family, infer: Callable) -> Optional[Agreement]:
    """At worker load, before warm-up: the archive's self-check on this machine, or a ConfigError
    that stops the load. None where the archive holds no self-check (its entry has no gate)."""
    path = Path(model_dir) / FILE
    if not path.is_file():
        log.info("%s %s: no self-check in this archive (not gated at build)", model, variant or "-")
        return None
    check = SelfCheck.read(path)
    started = time.perf_counter()
    found = check.measure(family, infer)
    elapsed_ms = (time.perf_counter() - started) * 1000
    if not found.passed:
        raise ConfigError(
            f"{model} (variant {variant or check.variant}) refused to load: its self-check on this machine measured "
            f"{check.summary(found)}, outside the accuracy gate's bound; the build measured {check.build_figure:.4f} "
            f"on {check.built_on}, this is {host()}. Fix: serve a variant of {model} that passes here (its marName in "
            f"config.properties: {model}.mar or {model}.<variant>.mar) or rebuild the archive on this machine "
            "(make build), whose gate then decides")
    log.info("%s %s: self-check passed on this machine in %.1f ms: %s (build host %s: %.4f)", model,
             variant or check.variant, elapsed_ms, check.summary(found), check.built_on, check.build_figure)
    return found
