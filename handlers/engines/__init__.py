"""The engine seam: the one place that knows which server runs the handler.

An engine adapter (TorchServe's: torchserve.py; Ray Serve's: ray.py) is all the handlers package
knows of its engine. It

- reads the worker's start-up facts (`worker(context) -> Worker`: model name and folder, version,
  device id, batch size, the archive's model-config);
- turns one batch into `Request` records (`requests(data, context, door) -> [Request]`, built by
  handlers/request.py's `open_request`, reading each request's headers and body once);
- writes each request's `Reply` back (`reply(context, requests, replies) -> [bytes]`: status, reason
  phrase, content type, response headers, the engine's end-of-answer marks);
- hands out a metrics sink (`metrics(context) -> MetricsSink | None`) and streams a chunk ahead of the
  answer (`send_intermediate(context, chunks)`).

Everything else (protocols, policies, families, loops) reads records and writes replies, and imports
without any engine installed. A second engine plugs in with one more module here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Optional, Protocol

Dimensions = tuple[tuple[str, str], ...]  # (name, value) pairs, the model's own first


@dataclass(frozen=True)
class Worker:
    """What a worker learns from its engine at start-up."""

    model_name: str
    model_dir: Path
    version: str = "1.0"
    gpu_id: Optional[int] = None
    max_batch_size: int = 1
    model_config: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


class MetricsSink(Protocol):
    """Where the handler's figures go (TorchServe: context.metrics, on to Prometheus)."""

    def time(self, name: str, ms: float, dims: Dimensions) -> None:
        """Cumulative milliseconds (a counter)."""

    def count(self, name: str, value: float, dims: Dimensions, unit: Optional[str] = None) -> None:
        """A counter; `unit` None: the engine's plain count."""

    def gauge(self, name: str, value: float, unit: str, dims: Dimensions) -> None:
        """A last value."""


def model_dims(model_name: str, *extra: tuple[str, str]) -> Dimensions:
    return (("ModelName", model_name), ("Level", "Model"), *extra)
