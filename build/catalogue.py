"""The catalogue: one YAML file saying what to serve and how, read into frozen dataclasses.

    models:
      <name>:
        version: "1.0"
        family: image_classifier | text_embedder | tensor     (handlers/families)
        model: <source>                  where the model comes from (build/sources.py)
        serialisation: state_dict | torchscript        (one way), or
        variants: [torchscript, onnx, onnx-int8, ...]  (several, each its own archive: build/variants.py)
        gate: {held_out: [...], min_cosine: ...}      (the variants' accuracy gate: build/gate.py)
        extra_files: [{path | package + file, as: name-in-archive}]
        settings: {runtime: ..., profiler: ..., <family>: ...}
        examples: [<request>, ...]       build/examples.py
        slo_ms: 100

An entry is parsed on demand, so one broken entry never stops the others from building.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from build.errors import CatalogueError
from build.examples import parse_examples
from build.files import FileSource, only_keys
from build.gate import GateSpec
from build.sources import default_serialisation, parse_source
from build.variants import Variant, parse_variants
from handlers.errors import ConfigError
from handlers.families import family_class

SERIALISATIONS = ("state_dict", "torchscript")
# TorchServe's per-model frontend values, in the order config.properties' models= entries list
# them: GET /models/<name> reports them, and a model-config.yaml that set them would override
# config.properties (so the catalogue refuses them in a model's settings).
FRONTEND_KEYS = ("minWorkers", "maxWorkers", "batchSize", "maxBatchDelay", "responseTimeout")
# TorchServe's limit, in seconds, on a worker's load (the handler's initialize: weights, self-check,
# warm-up), written as startupTimeout into every archive's model-config.yaml: TorchServe 0.12 takes an
# archive's value (120 when its model-config.yaml leaves it out) over config.properties'
# default_startup_timeout and models= startupTimeout. From the load times measured on 2 shared cores,
# with headroom (docs/configuration.md#the-startup-timeout); torch.compile compiles at warm-up.
STARTUP_TIMEOUT_S = 60
COMPILE_STARTUP_TIMEOUT_S = 600


def startup_timeout_s(graph: str) -> int:
    """The startupTimeout of an archive whose runtime.graph is `graph`."""
    return COMPILE_STARTUP_TIMEOUT_S if graph == "compile" else STARTUP_TIMEOUT_S


# A model's name: TorchServe's URL path segment and the archive's file name. Matched whole (fullmatch:
# `$` alone also matches before a final newline).
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_\-]*")


@dataclass(frozen=True)
class ExtraFile:
    source: FileSource
    name: str  # its name inside the archive

    @classmethod
    def parse(cls, where: str, raw: Mapping[str, Any]) -> ExtraFile:
        source = FileSource.parse(where, raw, ("as",))
        name = str(raw.get("as", source.name))
        if "/" in name or name.startswith(".") or name in ("handlers", "hf"):
            raise CatalogueError(f"{where}.as: {name!r} must be a plain file name")
        return cls(source, name)


@dataclass(frozen=True)
class ModelEntry:
    name: str
    version: str
    family: str
    model: Any  # a build.sources source
    variants: tuple[Variant, ...]  # the first is the default, archived as <name>.mar
    gate: GateSpec
    extra_files: tuple[ExtraFile, ...]
    settings: Mapping[str, Any]  # runtime / profiler / <family>: the archive's handler section, checked
    examples: tuple[Any, ...]  # build.examples.Example
    slo_ms: float

    @property
    def default_variant(self) -> Variant:
        return self.variants[0]


_ENTRY_KEYS = ("version", "family", "model", "serialisation", "variants", "gate", "extra_files", "settings",
               "examples", "slo_ms")


def parse_entry(name: str, raw: Mapping[str, Any]) -> ModelEntry:
    where = f"model {name!r}"
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise CatalogueError(f"{where}: name must be letters, digits, '_' or '-', starting with a letter: "
                             "rename the entry under models: in the catalogue")
    only_keys(where, raw, _ENTRY_KEYS, required=("version", "family", "model"))
    family = _family(where, raw["family"])
    source = parse_source(f"{where}.model", raw["model"], family.huggingface_class, family.huggingface_files)
    serialisation = raw.get("serialisation")
    if serialisation is not None and serialisation not in SERIALISATIONS:
        raise CatalogueError(f"{where}.serialisation: {serialisation!r} is not one of {list(SERIALISATIONS)}")
    settings = raw.get("settings") or {}
    if not isinstance(settings, Mapping):
        raise CatalogueError(f"{where}.settings: expected a mapping")
    graph = (settings.get("runtime") or {}).get("graph") if isinstance(settings.get("runtime"), Mapping) else None
    if "variants" in raw:
        variants = parse_variants(where, raw["variants"], serialisation, graph)
    else:
        variants = parse_variants(where, None, serialisation or default_serialisation(source), graph)
    misplaced = [key for key in (*FRONTEND_KEYS, "weights", "family", "source") if key in settings]
    if misplaced:
        raise CatalogueError(f"{where}.settings: {misplaced[0]!r} does not belong here "
                             "(config.properties, the entry or the build sets it)")
    extras = raw.get("extra_files") or []
    if not isinstance(extras, list):
        raise CatalogueError(f"{where}.extra_files: expected a list")
    slo_ms = raw.get("slo_ms", 100)
    if not isinstance(slo_ms, (int, float)) or isinstance(slo_ms, bool) or slo_ms <= 0:
        raise CatalogueError(f"{where}.slo_ms: expected a positive number of milliseconds")
    return ModelEntry(
        name=name,
        version=str(raw["version"]),
        family=str(raw["family"]),
        model=source,
        variants=variants,
        gate=GateSpec.parse(f"{where}.gate", raw.get("gate")),
        extra_files=tuple(ExtraFile.parse(f"{where}.extra_files[{i}]", e) for i, e in enumerate(extras)),
        settings=settings,
        examples=parse_examples(f"{where}.examples", raw.get("examples") or []),
        slo_ms=float(slo_ms),
    )


def _family(where: str, family: Any) -> type:
    try:
        return family_class(str(family))
    except ConfigError as err:
        raise CatalogueError(f"{where}.family: {err.message}") from None


@dataclass(frozen=True)
class Catalogue:
    path: Path
    raw_entries: Mapping[str, Any]

    @classmethod
    def load(cls, path: Path) -> Catalogue:
        try:
            data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as err:
            raise CatalogueError(f"cannot read catalogue {path}: {err}") from None
        only_keys(str(path), data or {}, ("models",), required=("models",))
        if not isinstance(data["models"], Mapping) or not data["models"]:
            raise CatalogueError(f"{path}: 'models' must map model names to entries")
        return cls(path=Path(path), raw_entries=dict(data["models"]))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.raw_entries)

    def names_of(self, generating: bool) -> tuple[str, ...]:
        """The models whose family generates (served step by step: causal_lm), or the others."""
        return tuple(n for n in self.names
                     if family_class(str(self.raw_entries[n].get("family"))).generates == generating)

    def entry(self, name: str) -> ModelEntry:
        """Parse one entry on demand, so one broken entry does not stop the others from building."""
        if name not in self.raw_entries:
            raise CatalogueError(f"no model {name!r} in {self.path} (known: {', '.join(self.names)})")
        return parse_entry(name, self.raw_entries[name])

    def entries(self) -> dict[str, ModelEntry]:
        return {name: self.entry(name) for name in self.names}
