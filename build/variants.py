"""Numeric variants of a catalogue entry: the same model, exported differently, each its own archive.

    variants: [aoti, torchscript, onnx, {onnx-int8: {keep_fp32: [<MatMul node>, ...]}}, int8]
    variants: [torchscript, {aoti: {pin: true}}]     # make tune serves aoti without comparing

The first is the entry's default (`model_store/<name>.mar`); every other one is archived as
`model_store/<name>.<variant>.mar` under the same model name, so config.properties chooses which one
TorchServe loads (`load_models`, `marName`) and clients keep the same URL. Every variant but the
default must pass the accuracy gate (build/gate.py) against the fp32 eager model, or it is not
archived; the default must pass too, or the entry fails. An entry without `variants` has one, from
its `serialisation` (and `settings.runtime.graph`), as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from build.errors import CatalogueError
from build.files import only_keys


@dataclass(frozen=True)
class Kind:
    """What a variant name means: how it is exported and how the worker runs it."""

    serialisation: str  # state_dict (the worker rebuilds the architecture) | torchscript | onnx | aoti
    graph: str  # runtime.graph of its archive
    weights_file: str
    precision: Optional[str]  # forced runtime.precision; None: the entry's
    options: tuple[str, ...] = ()  # keys a catalogue entry may give it
    about: str = ""
    # Where it runs when runtime.device is auto: "cpu" for what has no GPU path in the serve lock
    # (ONNX Runtime's CPU package); None: wherever TorchServe places the worker.
    device: Optional[str] = None
    gpu: bool = True  # False: no CUDA kernels at all (runtime.device: gpu is refused)


KINDS: Mapping[str, Kind] = {
    "eager": Kind("state_dict", "eager", "model.pt", None, about="the module as written, the entry's precision"),
    "compile": Kind("state_dict", "compile", "model.pt", None, about="torch.compile in the worker (compiled at warm-up)"),
    "torchscript": Kind("torchscript", "torchscript", "model.ts", None,
                        about="traced under the entry's precision and frozen"),
    # torch.ao.quantization.quantize_dynamic is deprecated in torch 2.13 (torchao replaces it); it
    # still quantises nn.Linear here, and the trace keeps its quantized::linear_dynamic ops.
    # TorchScript is deprecated upstream (torch.export replaces it): kept because users ask for it by name.
    "aoti": Kind("aoti", "aoti", "model.pt2", None, device="cpu", gpu=False,
                 about="torch.export -> AOTInductor package compiled here for this CPU, the entry's precision"),
    "int8": Kind("torchscript", "torchscript", "model.ts", "fp32",
                 about="torch dynamic int8 of every nn.Linear (deprecated API), traced", device="cpu", gpu=False),
    "onnx": Kind("onnx", "onnx", "model.onnx", "fp32", about="ONNX through torch.export (opset 20), ONNX Runtime CPU", device="cpu"),
    "onnx-int8": Kind("onnx", "onnx", "model.onnx", "fp32", options=("keep_fp32", "per_channel"),
                      about="ONNX Runtime dynamic int8 of MatMul/Gemm weights, per channel", device="cpu"),
}


@dataclass(frozen=True)
class Variant:
    name: str
    kind: Kind
    keep_fp32: tuple[str, ...] = ()  # onnx-int8: MatMul nodes left unquantised (the sensitive ones)
    per_channel: bool = True
    default: bool = False  # the entry's first: archived as <name>.mar
    pin: bool = False  # make tune serves this one (if it passed the gate) instead of choosing by capacity

    def archive_name(self, model: str) -> str:
        return f"{model}.mar" if self.default else f"{model}.{self.name}.mar"

    @property
    def serialisation(self) -> str:
        return self.kind.serialisation


def parse_variant(where: str, raw: Any, default: bool) -> Variant:
    if isinstance(raw, str):
        name, options = raw, {}
    elif isinstance(raw, Mapping) and len(raw) == 1:
        ((name, options),) = raw.items()
        options = options or {}
    else:
        raise CatalogueError(f"{where}: a variant name ({', '.join(KINDS)}) or {{name: {{options}}}}")
    if name not in KINDS:
        raise CatalogueError(f"{where}: unknown variant {name!r} (known: {', '.join(KINDS)})")
    kind = KINDS[name]
    if not isinstance(options, Mapping):
        raise CatalogueError(f"{where}.{name}: options are a mapping")
    only_keys(f"{where}.{name}", options, (*kind.options, "pin"))
    keep = options.get("keep_fp32", [])
    if not isinstance(keep, list) or not all(isinstance(node, str) for node in keep):
        raise CatalogueError(f"{where}.{name}.keep_fp32: a list of ONNX node names (MatMul/Gemm)")
    per_channel = options.get("per_channel", True)
    if not isinstance(per_channel, bool):
        raise CatalogueError(f"{where}.{name}.per_channel: true or false")
    pin = options.get("pin", False)
    if not isinstance(pin, bool):
        raise CatalogueError(f"{where}.{name}.pin: true (make tune serves this variant) or false")
    return Variant(name, kind, tuple(keep), per_channel, default, pin)


def parse_variants(where: str, raw: Any, serialisation: Optional[str], graph: Optional[str]) -> tuple[Variant, ...]:
    """The entry's variants; without a `variants` list, the one its serialisation (and graph) name."""
    if raw is None:
        if serialisation == "torchscript":
            return (Variant("torchscript", KINDS["torchscript"], default=True),)
        name = "compile" if graph == "compile" else "eager"
        return (Variant(name, KINDS[name], default=True),)
    if serialisation is not None:
        raise CatalogueError(f"{where}.serialisation: each variant says how it is serialised: drop "
                             "serialisation, or drop variants")
    if graph is not None:
        raise CatalogueError(f"{where}.settings.runtime.graph: each variant sets its graph: drop it")
    if not isinstance(raw, list) or not raw:
        raise CatalogueError(f"{where}.variants: a non-empty list, e.g. [torchscript, onnx, onnx-int8]")
    variants = tuple(parse_variant(f"{where}.variants[{i}]", item, i == 0) for i, item in enumerate(raw))
    names = [v.name for v in variants]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise CatalogueError(f"{where}.variants: {repeated[0]!r} is listed twice")
    pinned = [v.name for v in variants if v.pin]
    if len(pinned) > 1:
        raise CatalogueError(f"{where}.variants: {pinned[0]!r} and {pinned[1]!r} are both pinned: pin one at most")
    return variants
