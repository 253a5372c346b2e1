"""How an eager archive rebuilds its model's architecture (its weights are loaded apart, always
with weights_only=True). Used by the build, from the catalogue's source, and by the worker, from
the archive's model-config.yaml (`handler.source`):

    source: {module: digits_cnn, attribute: DigitsCNN, args: {width: 16}}
    source: {module: efficientnet_lite_pytorch, attribute: EfficientNet.from_name,
             args: {model_name: efficientnet-lite0}}
    source: {huggingface: hf}       # a Hugging Face config folder inside the archive
    source: {huggingface: hf, auto: AutoModelForCausalLM}

A TorchScript archive needs none of this: the worker only loads the graph.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Optional, Union

import torch

from handlers.errors import ConfigError


@dataclass(frozen=True)
class ModuleSource:
    """An nn.Module made by calling `module.attribute(**args)`: a class, or a factory such as
    `Class.from_name`. `module` is importable from the archive's folder (a staged user file) or
    from the environment (an installed package)."""

    module: str
    attribute: str
    args: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def build(self, search_path: Optional[Path] = None) -> torch.nn.Module:
        where = f"source {self.module}:{self.attribute}"
        with _importable_from(search_path):
            try:
                target: Any = importlib.import_module(self.module)
            except ImportError as err:
                raise ConfigError(f"{where}: module {self.module!r} does not import: {err}") from None
        for part in self.attribute.split("."):
            if not hasattr(target, part):
                raise ConfigError(f"{where}: {self.module!r} has no {self.attribute!r}")
            target = getattr(target, part)
        try:
            model = target(**dict(self.args))
        except TypeError as err:
            raise ConfigError(f"{where}: cannot be called with args {dict(self.args)}: {err}") from None
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"{where}: returned a {type(model).__name__}, not a torch.nn.Module")
        return model

    def to_json(self) -> dict:
        return {"module": self.module, "attribute": self.attribute, "args": dict(self.args)}


@dataclass(frozen=True)
class HuggingFaceSource:
    """A Hugging Face model from a local folder: config.json, and the weights when built with them
    (at build time; a worker builds from the config and loads its own weights). `auto`: the
    transformers Auto class the family needs (AutoModel for encoders, AutoModelForCausalLM)."""

    folder: str
    auto: str = "AutoModel"

    def build(self, search_path: Optional[Path] = None, with_weights: bool = False) -> torch.nn.Module:
        import transformers
        from transformers import AutoConfig

        folder = Path(search_path or ".") / self.folder
        if not (folder / "config.json").is_file():
            raise ConfigError(f"source huggingface: no config.json in {folder}")
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
        auto = getattr(transformers, self.auto)

        # fp32 whatever dtype the folder's config names (transformers follows it): the handler's
        # precision setting decides what runs, and the gate's reference is fp32.
        def make(attention: Optional[str]) -> torch.nn.Module:
            if with_weights:
                return auto.from_pretrained(str(folder), config=config, local_files_only=True,
                                            attn_implementation=attention, dtype=torch.float32)
            return auto.from_config(config, attn_implementation=attention, dtype=torch.float32)

        try:  # scaled-dot-product attention (one fused kernel) where the architecture has it
            return make("sdpa")
        except (ValueError, ImportError):
            return make(None)

    def to_json(self) -> dict:
        return {"huggingface": self.folder} if self.auto == "AutoModel" else {"huggingface": self.folder, "auto": self.auto}


AUTO_CLASSES = ("AutoModel", "AutoModelForCausalLM")


Source = Union[ModuleSource, HuggingFaceSource]


def source_from(raw: Optional[Mapping[str, Any]], where: str = "handler.source") -> Optional[Source]:
    """The source a model-config.yaml names; None for a TorchScript archive."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(raw).__name__}")
    if "huggingface" in raw and set(raw) <= {"huggingface", "auto"} and isinstance(raw["huggingface"], str):
        auto = raw.get("auto", "AutoModel")
        if auto not in AUTO_CLASSES:
            raise ConfigError(f"{where}.auto: {auto!r} is not one of {list(AUTO_CLASSES)}")
        return HuggingFaceSource(raw["huggingface"], auto)
    if {"module", "attribute"} <= set(raw) <= {"module", "attribute", "args"}:
        args = raw.get("args") or {}
        if not isinstance(args, Mapping):
            raise ConfigError(f"{where}.args: expected a mapping of constructor arguments")
        return ModuleSource(str(raw["module"]), str(raw["attribute"]), MappingProxyType(dict(args)))
    raise ConfigError(f"{where}: expected {{module, attribute[, args]}} or {{huggingface: <folder>}}, got {sorted(raw)}")


@contextmanager
def _importable_from(folder: Optional[Path]) -> Iterator[None]:
    """`folder` first on sys.path while importing (TorchServe puts the archive's folder there too)."""
    if folder is None or str(folder) in sys.path:
        yield
        return
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))
