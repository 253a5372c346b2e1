"""Export: the entry's model with its family's head, checked the way the worker will run it, saved
as a state dict (the worker rebuilds the architecture from the source), as a frozen TorchScript
graph traced here under the served precision, as an ONNX graph or as an AOTInductor package
(build/aoti_export.py): the worker only loads those."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any, Optional

import torch

from build.aoti_export import export_aoti
from build.catalogue import ModelEntry
from build.errors import CatalogueError, ExportError
from build.examples import expected_top1, worker_input
from build.onnx_export import export_onnx, quantize_int8
from build.sources import ExportedProgram, TorchScriptFile, runtime_source
from build.variants import Variant
from handlers import runtime
from handlers.aoti import load_aoti
from handlers.errors import ConfigError, HandlerError
from handlers.families import Family, family_class
from handlers.onnx_session import load_onnx
from handlers.settings import HandlerSettings


def handler_section(entry: ModelEntry, variant: Optional[Variant] = None) -> dict[str, Any]:
    """The archive's `handler:` section for one variant (the entry's default when none is named): the
    entry's settings, its family, the variant's graph and weights file and (for an eager archive)
    how to rebuild the architecture. Impossible combinations refused."""
    variant = variant or entry.default_variant
    where = f"model {entry.name!r}"
    section = copy.deepcopy(dict(entry.settings))
    rt = dict(section.get("runtime") or {})
    graph = rt.get("graph", "eager")
    source = entry.model
    serialised = variant.serialisation in ("torchscript", "onnx", "aoti")
    if isinstance(source, (TorchScriptFile, ExportedProgram)) and variant.name != "torchscript":
        raise CatalogueError(f"{where}: a {type(source).__name__} model is served as TorchScript: "
                             f"set serialisation: torchscript (variant {variant.name!r} needs the eager model)")
    if family_class(entry.family).generates and variant.name != "eager":
        raise CatalogueError(f"{where}: the {entry.family} family generates step by step over the eager model's "
                             f"KV cache: variant {variant.name!r} is not available for it (use eager)")
    if variant.serialisation == "torchscript":
        if graph not in ("eager", "torchscript"):
            raise CatalogueError(f"{where}.settings.runtime.graph: {graph!r} cannot run a TorchScript archive: "
                                 "drop it, or set serialisation: state_dict")
        if isinstance(source, TorchScriptFile) and rt.get("precision", "fp32") != "fp32":
            raise CatalogueError(f"{where}.settings.runtime.precision: a TorchScript file runs as it was exported: "
                                 "set fp32, or give the eager model (python / huggingface) to trace at that precision")
    elif graph == "torchscript":
        raise CatalogueError(f"{where}.settings.runtime.graph: torchscript needs serialisation: torchscript")
    if serialised or variant.name == "compile":
        rt["graph"] = variant.kind.graph
    if variant.kind.precision is not None:
        rt["precision"] = variant.kind.precision
    if variant.serialisation in ("torchscript", "aoti") and runtime.resolve_precision(rt.get("precision", "fp32"),
                                                                             torch.device("cpu")) is None:
        rt["precision"] = "fp32"  # traced as this CPU runs it (no native bf16/fp16): the archive says so
    if variant.serialisation in ("onnx", "aoti"):
        rt["channels_last"] = False  # ONNX Runtime takes NCHW; Inductor picks its own layouts inside the package
    wanted = rt.get("device", "auto")
    if wanted == "gpu" and not variant.kind.gpu:
        raise CatalogueError(f"{where}.settings.runtime.device: gpu, but variant {variant.name!r} has no CUDA kernels "
                             "(torch's dynamic int8 runs on the CPU only): drop the variant or set device auto")
    if wanted == "auto" and variant.kind.device is not None:
        rt["device"] = variant.kind.device  # the archive says so: TorchServe then hands its workers no GPU
    section["runtime"] = rt
    section["family"] = entry.family
    section["variant"] = variant.name
    section["weights"] = variant.kind.weights_file
    served = None if serialised else runtime_source(source, "state_dict")
    if served is not None:
        section["source"] = served.to_json()
    return section


def device_keys(section: dict[str, Any]) -> dict[str, Any]:
    """TorchServe's placement keys for the archive's model-config.yaml, from its runtime.device:
    deviceType cpu or gpu (auto: none, TorchServe places the workers), and deviceIds when given."""
    rt = section.get("runtime") or {}
    wanted = rt.get("device", "auto")
    keys: dict[str, Any] = {} if wanted == "auto" else {"deviceType": wanted}
    if rt.get("device_ids"):
        keys["deviceIds"] = list(rt["device_ids"])
    return keys


def parse_settings(entry: ModelEntry, section: dict[str, Any]) -> HandlerSettings:
    """Validate the section exactly as the worker will, so a bad key fails the build, not the server."""
    try:
        return HandlerSettings.from_mapping(section, where=f"model {entry.name!r} settings")
    except ConfigError as err:
        raise CatalogueError(f"{err} (catalogue: settings.{entry.family} / settings.runtime)") from None


def make_family(entry: ModelEntry, settings: HandlerSettings, content: Path) -> Family:
    try:
        return family_class(entry.family)(settings.family_settings, content, settings.runtime.channels_last)
    except (ConfigError, OSError, ValueError) as err:
        raise CatalogueError(f"model {entry.name!r} settings.{entry.family}: {err}") from None


def export(entry: ModelEntry, variant: Variant, settings: HandlerSettings, family: Family, root: Path,
           content: Path, reference: Optional[torch.nn.Module] = None) -> Path:
    """Write the variant's served weights into `content` and return their path. `reference`: the
    family-wrapped fp32 eager model, when the caller has it loaded already."""
    target = content / variant.kind.weights_file
    where = f"model {entry.name!r} model"
    if isinstance(entry.model, TorchScriptFile):
        shutil.copy2(entry.model.source.resolve(root, f"{where}.torchscript"), target)
        return target
    model = reference if reference is not None else reference_model(entry, family, root)
    if variant.serialisation == "state_dict":
        torch.save(model.state_dict(), target)
    elif variant.name == "int8":
        torch.jit.save(trace(torch_int8(model), family, settings), str(target))
    elif variant.serialisation == "torchscript":
        torch.jit.save(trace(model, family, settings), str(target))
    elif variant.serialisation == "aoti":
        dtype = runtime.resolve_precision(settings.runtime.precision, torch.device("cpu"))
        export_aoti(model, _as_tuple(family.example_batch(2)), target, dtype, f"model {entry.name!r} variant aoti")
    else:
        onnx_file = export_onnx(model, _as_tuple(family.example_batch(2)), content / "fp32.onnx")
        if variant.name == "onnx-int8":
            quantize_int8(onnx_file, target, variant.keep_fp32, variant.per_channel)
            onnx_file.unlink()
        else:
            onnx_file.rename(target)
    return target


def reference_model(entry: ModelEntry, family: Family, root: Path) -> torch.nn.Module:
    """The family-wrapped model in fp32 eager: what every variant is exported from and gated against.
    A fresh copy each call: exporting a variant may change the module it is given."""
    return family.wrap(entry.model.load(root, f"model {entry.name!r} model")).eval()


def torch_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Dynamic int8 of every nn.Linear (torch.ao's quantize_dynamic: deprecated in torch 2.13, still here)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)


def _as_tuple(batch) -> tuple:
    return batch if isinstance(batch, tuple) else (batch,)


def trace(model: torch.nn.Module, family: Family, settings: HandlerSettings) -> torch.jit.ScriptModule:
    """Trace on the family's example batch (under the served precision, so its casts are in the graph), freeze."""
    rt = settings.runtime
    example = family.example_batch(2)
    example = example if isinstance(example, tuple) else (example,)
    if rt.channels_last:
        model = model.to(memory_format=torch.channels_last)
        example = tuple(runtime.memory_format(t, True) for t in example)
    dtype = runtime.resolve_precision(rt.precision, torch.device("cpu"))
    try:
        with torch.no_grad(), runtime.autocast(torch.device("cpu"), dtype):
            traced = torch.jit.trace(model, example, check_trace=False)
        return torch.jit.freeze(traced.eval())
    except AssertionError as err:  # a torch.export program's shape guard: exported for one batch size
        raise ExportError(f"the model refused a batch of 2 ({err}): export it with a dynamic batch dimension "
                          "(torch.export.export(..., dynamic_shapes=...) with torch.export.Dim)") from None
    except (RuntimeError, TypeError, ValueError) as err:
        raise ExportError(f"TorchScript tracing failed: {err}") from None


def smoke_test(entry: ModelEntry, family: Family, served: Path, settings: HandlerSettings, root: Path) -> tuple[str, ...]:
    """The archive's model on a batch of its family's examples and on each catalogue example, in
    this process, the worker's way: problems come out here, naming the entry, not in a server log."""
    where = f"model {entry.name!r}"
    model = load_served(served, settings, family, root)
    batches = [family.example_batch(2)]
    for example in entry.examples:
        request = example.request(root)
        try:
            batches.append(family.collate([family.decode(worker_input(request.body, request.content_type), request.content_type)]))
        except HandlerError as err:
            raise ExportError(f"{where}.examples: {example.name} is refused by the model: {err.message}") from None
    answers = []
    try:
        for batch in batches:
            inputs = family.model_inputs(batch)
            with torch.inference_mode():
                answers.append(family.postprocess(model(*inputs), batch))
    except (RuntimeError, ValueError, TypeError, IndexError, ConfigError) as err:
        message = getattr(err, "message", None) or str(err).splitlines()[0][:300]
        raise ExportError(f"{where}: the model fails on its family's input ({type(err).__name__}: {message}); "
                          f"check settings.{entry.family} against what the model takes and returns") from None
    problems = [expected_top1(example, answer[0]) for example, answer in zip(entry.examples, answers[1:])]
    return tuple(p for p in problems if p)


def load_served(served: Path, settings: HandlerSettings, family: Family, root: Path):
    """The archive's model, loaded the way the worker loads it (ONNX: a session on this process's threads)."""
    if settings.runtime.graph == "torchscript":
        return torch.jit.load(str(served), map_location="cpu").eval()
    if settings.runtime.graph == "onnx":
        return load_onnx(served, torch.get_num_threads())
    if settings.runtime.graph == "aoti":
        return load_aoti(served, torch.device("cpu"))
    model = family.wrap(settings.source.build(served.parent))
    model.load_state_dict(torch.load(served, map_location="cpu", weights_only=True))
    return model.eval()


def served_settings(entry: ModelEntry, variant: Optional[Variant] = None) -> HandlerSettings:
    """The settings an entry's archive runs with (family, its settings, runtime), as the worker reads them."""
    return parse_settings(entry, handler_section(entry, variant))
