"""Handler settings: read once from the archive's model-config.yaml `handler:` section.

Frozen dataclasses, built at the edge (``initialize``) and passed around as objects.
An unknown key is an error that names the key, so a typo never silently means "default".
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from handlers.deadlines import MAX_TIMEOUT_MS
from handlers.errors import ConfigError
from handlers.families import family_class
from handlers.response_cache import ResponseCacheSettings
from handlers.sources import Source, source_from

Precision = Literal["fp32", "bf16", "fp16"]
Graph = Literal["eager", "torchscript", "compile", "onnx", "aoti"]
# auto: a GPU when TorchServe hands the worker a gpu_id and torch can use it, else the CPU; cpu: never a
# GPU (the build writes deviceType: cpu, so TorchServe hands none); gpu: deviceType: gpu.
Device = Literal["auto", "cpu", "gpu"]
# Graphs serialised whole at build time: the worker loads them and needs no architecture source.
SERIALISED_GRAPHS = ("torchscript", "onnx", "aoti")


def _check_value(where: str, name: str, hint: Any, value: Any) -> Any:
    """Type-check one value against its annotation; returns the value (ints widen to float)."""
    origin = typing.get_origin(hint)
    if origin is Literal:
        if value not in typing.get_args(hint):
            raise ConfigError(f"{where}.{name}: {value!r} is not one of {list(typing.get_args(hint))}")
        return value
    if origin is typing.Union:  # Optional[X]
        if value is None:
            return None
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _check_value(where, name, inner, value)
    if origin is tuple:  # Tuple[X, ...] from a YAML list
        (inner, _) = typing.get_args(hint)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}.{name}: expected a list, got {value!r}")
        return tuple(_check_value(where, name, inner, item) for item in value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{where}.{name}: expected an integer, got {value!r}")
    if hint in (str, bool, float) and not isinstance(value, hint):
        raise ConfigError(f"{where}.{name}: expected {hint.__name__}, got {value!r}")
    return value


def parse_section(cls, mapping: Optional[Mapping[str, Any]], where: str):
    """Build dataclass ``cls`` from a mapping; unknown keys and wrong types raise ConfigError."""
    mapping = {} if mapping is None else mapping
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(mapping).__name__}")
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(mapping) - set(known))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known keys: {', '.join(sorted(known))})")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, value in mapping.items():
        if dataclasses.is_dataclass(hints[name]):
            values[name] = parse_section(hints[name], value, f"{where}.{name}")
        else:
            values[name] = _check_value(where, name, hints[name], value)
    return cls(**values)


@dataclass(frozen=True)
class RuntimeSettings:
    """How the model runs: device, thread budget, precision, graph mode, memory format, warm-up."""

    device: Device = "auto"
    # Which of the host's GPUs the model's workers take (TorchServe's deviceIds; the build writes it
    # into the archive's model-config.yaml); None: every GPU, round robin.
    device_ids: Optional[tuple[int, ...]] = None
    threads: Optional[int] = None  # None: physical cores / workers of this model
    interop_threads: int = 1
    precision: Precision = "fp32"
    graph: Graph = "eager"
    compile_mode: str = "default"
    optimize_for_inference: bool = False  # torchscript only; off: it can be slower (docs/optimisations.md)
    preprocess_threads: Optional[int] = 1  # decode a batch's requests in parallel; None: = threads
    channels_last: bool = False
    warmup: bool = True
    freeze_heap: bool = True  # gc.freeze() after start-up: full collections skip the model's objects
    cudnn_benchmark: bool = True
    # On a GPU: one CUDA graph per batch bucket, captured at warm-up and replayed instead of launching
    # each kernel (handlers/cuda_graphs.py); inputs of another shape run as usual.
    cuda_graphs: bool = False
    # A request's answer is due this many ms after it arrived, else it is answered 504 without being
    # computed (handlers/deadlines.py); 0: no deadline. A request's X-Request-Timeout-Ms replaces it.
    deadline_ms: int = 0
    # OpenTelemetry spans per request (handlers/tracing.py): null follows the worker's environment
    # (on when OTEL_EXPORTER_OTLP_ENDPOINT is set), true/false force it on/off for this archive.
    tracing: Optional[bool] = None

    def __post_init__(self):
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"runtime.threads: must be >= 1 or null for auto, got {self.threads}")
        if self.preprocess_threads is not None and self.preprocess_threads < 1:
            raise ConfigError(f"runtime.preprocess_threads: must be >= 1 or null, got {self.preprocess_threads}")
        if self.interop_threads < 1:
            raise ConfigError(f"runtime.interop_threads: must be >= 1, got {self.interop_threads}")
        if self.device_ids is not None and (self.device == "cpu" or not self.device_ids or min(self.device_ids) < 0):
            raise ConfigError(f"runtime.device_ids: GPU indices (>= 0) for device auto or gpu, got {self.device_ids} "
                              f"with device {self.device!r}")
        if not 0 <= self.deadline_ms <= MAX_TIMEOUT_MS:
            raise ConfigError(f"runtime.deadline_ms: must be 0 (no deadline) .. {MAX_TIMEOUT_MS}, got {self.deadline_ms}")


@dataclass(frozen=True)
class ProfilerSettings:
    """torch.profiler schedule, used only when ENABLE_TORCH_PROFILER=true in the server's environment."""

    wait: int = 1
    warmup: int = 1
    active: int = 3
    repeat: int = 1
    trace_dir: str = ""  # empty: <server working dir>/logs/torch_profiler
    top_operators: int = 15


@dataclass(frozen=True)
class HandlerSettings:
    """The whole `handler:` section of an archive's model-config.yaml."""

    family: str  # a name in handlers.families.FAMILIES
    weights: str  # the served weights' file in the archive
    family_settings: Any  # that family's Settings, from the section named after it
    source: Optional[Source] = None  # how an eager archive rebuilds its architecture
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    profiler: ProfilerSettings = field(default_factory=ProfilerSettings)
    variant: str = ""  # the catalogue variant this archive was built as (build/variants.py): logs, caches
    response_cache: ResponseCacheSettings = field(default_factory=ResponseCacheSettings)  # off by default

    @classmethod
    def from_mapping(cls, section: Optional[Mapping[str, Any]], where: str = "handler") -> HandlerSettings:
        section = dict(section or {})
        name = section.get("family")
        if not isinstance(name, str):
            raise ConfigError(f"{where}.family: the model family is required (e.g. image_classifier)")
        family = family_class(name)
        known = {"family", "weights", "source", "variant", "runtime", "profiler", "response_cache", name}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown key {unknown[0]!r} (known keys: {', '.join(sorted(known))})")
        weights = section.get("weights")
        if not isinstance(weights, str) or not weights:
            raise ConfigError(f"{where}.weights: the weights file name is required")
        settings = cls(
            family=name,
            weights=weights,
            family_settings=parse_section(family.Settings, section.get(name), f"{where}.{name}"),
            source=source_from(section.get("source"), f"{where}.source"),
            variant=_check_value(where, "variant", str, section.get("variant", "")),
            runtime=parse_section(RuntimeSettings, section.get("runtime"), f"{where}.runtime"),
            profiler=parse_section(ProfilerSettings, section.get("profiler"), f"{where}.profiler"),
            response_cache=parse_section(ResponseCacheSettings, section.get("response_cache"), f"{where}.response_cache"),
        )
        if (settings.runtime.graph in SERIALISED_GRAPHS) == (settings.source is not None):
            raise ConfigError(f"{where}.source: an eager archive needs one (how to rebuild the architecture), "
                              "a TorchScript, ONNX or AOTInductor one has none")
        return settings
