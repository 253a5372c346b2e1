"""Export: load the real weights into the handler's architecture, then save a state dict or a
frozen TorchScript module (made here, at build time, so the worker only loads it)."""

from __future__ import annotations

import copy
import importlib
import inspect
from pathlib import Path
from typing import Any, Dict, Mapping

import torch

from build.catalogue import ModelEntry
from build.errors import CatalogueError, ExportError
from handlers import runtime
from handlers.base import ModelHandler
from handlers.errors import ConfigError
from handlers.settings import HandlerSettings

WEIGHTS_FILE = {"state_dict": "model.pt", "torchscript": "model.ts"}


def handler_class(entry: ModelEntry) -> type:
    """The one ModelHandler subclass its module defines (TorchServe instantiates exactly that)."""
    try:
        module = importlib.import_module(entry.handler_module)
    except Exception as err:  # any failure to import is this entry's problem, reported by name
        raise CatalogueError(f"model {entry.name!r}: handler {entry.handler} does not import: {err!r}") from None
    classes = [
        c for _, c in inspect.getmembers(module, inspect.isclass)
        if c.__module__ == module.__name__ and issubclass(c, ModelHandler)
    ]
    defined = [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == module.__name__]
    if len(classes) != 1 or len(defined) != 1:
        raise CatalogueError(
            f"model {entry.name!r}: {entry.handler} must define exactly one class, a ModelHandler subclass "
            f"(TorchServe instantiates the only class of the module); found {[c.__name__ for c in defined]}"
        )
    return classes[0]


def handler_section(entry: ModelEntry) -> Dict[str, Any]:
    """The archive's `handler:` section: catalogue settings + the exported weights' file name."""
    section = copy.deepcopy(dict(entry.settings))
    runtime_section = dict(section.get("runtime") or {})
    graph = runtime_section.get("graph", "eager")
    if entry.serialisation == "torchscript":
        runtime_section["graph"] = "torchscript"
    elif graph == "torchscript":
        raise CatalogueError(f"model {entry.name!r}: runtime.graph torchscript needs serialisation: torchscript")
    section["runtime"] = runtime_section
    section["weights"] = WEIGHTS_FILE[entry.serialisation]
    return section


def parse_settings(entry: ModelEntry, cls: type, section: Mapping[str, Any]) -> HandlerSettings:
    """Validate the section exactly as the worker will, so a bad key fails the build, not the server."""
    try:
        return HandlerSettings.from_mapping(section, cls.family_settings_type, where=f"model {entry.name!r} settings")
    except ConfigError as err:
        raise CatalogueError(str(err)) from None


def load_state_dict(entry: ModelEntry, path: Path) -> Dict[str, torch.Tensor]:
    if entry.weights.format == "safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path))
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, Mapping):
        raise ExportError(f"model {entry.name!r}: {path.name} is not a state dict")
    ignore = entry.weights.ignore_keys
    return {
        entry.weights.key_prefix + key: value
        for key, value in state.items()
        if not any(key.startswith(prefix) for prefix in ignore)
    }


def export(entry: ModelEntry, cls: type, settings: HandlerSettings, weights: Path, stage: Path) -> Path:
    """Write the served weights into ``stage`` and return their path."""
    model = cls.build_model(settings.family, stage)
    result = model.load_state_dict(load_state_dict(entry, weights), strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ExportError(
            f"model {entry.name!r}: weights do not fit the architecture: "
            f"missing {result.missing_keys[:5]}, unexpected {result.unexpected_keys[:5]} "
            "(see weights.key_prefix / weights.ignore_keys in the catalogue)"
        )
    model.eval()
    target = stage / WEIGHTS_FILE[entry.serialisation]
    if entry.serialisation == "state_dict":
        torch.save(model.state_dict(), target)
    else:
        torch.jit.save(trace(cls, model, settings, stage), str(target))
    return target


def trace(cls: type, model: torch.nn.Module, settings: HandlerSettings, stage: Path) -> torch.jit.ScriptModule:
    """Trace on a real example batch (under the served precision, so its casts are in the graph), freeze."""
    handler = cls()
    handler.settings = settings
    handler.device = torch.device("cpu")
    handler.setup(stage)
    example = handler.example_batch(2)
    example = example if isinstance(example, tuple) else (example,)
    rt = settings.runtime
    if rt.channels_last:
        model = model.to(memory_format=torch.channels_last)
    dtype = runtime.resolve_precision(rt.precision, handler.device)
    try:
        with torch.no_grad(), runtime.autocast(handler.device, dtype):
            traced = torch.jit.trace(model, example, check_trace=False)
        return torch.jit.freeze(traced.eval())
    except (RuntimeError, TypeError) as err:
        raise ExportError(f"TorchScript tracing failed: {err}") from None
