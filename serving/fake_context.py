"""A stand-in for TorchServe's Context: enough to run a handler in-process, with no server.

Used by the unit tests and by the in-process benchmark (the serving limit); never by e2e tests.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Optional

import yaml


class FakeMetrics:
    def __init__(self):
        self.calls: list[tuple[str, str, float, dict]] = []

    def add_time(self, name, value, idx=None, unit="ms", dimensions=(), metric_type=None):
        self.calls.append(("time", name, value, {d.name: d.value for d in dimensions}))

    def add_counter(self, name, value, idx=None, dimensions=()):
        self.calls.append(("counter", name, value, {d.name: d.value for d in dimensions}))

    def add_metric(self, name, value, unit, idx=None, dimensions=(), metric_type=None):
        kind = getattr(metric_type, "name", "counter").lower()
        self.calls.append((kind, name, value, {d.name: d.value for d in dimensions}))

    def last(self, name: str):
        """The latest value sent under this name (None if never)."""
        return next((call[2] for call in reversed(self.calls) if call[1] == name), None)


class FakeContext:
    def __init__(self, model_dir: Path, model_name: str, batch_size: int = 4,
                 handler_overrides: Optional[dict] = None, gpu_id: Optional[int] = None):
        config = yaml.safe_load((model_dir / "model-config.yaml").read_text())
        for section, values in (handler_overrides or {}).items():
            if isinstance(values, dict):
                config["handler"].setdefault(section, {}).update(values)
            else:
                config["handler"][section] = values
        self.model_name = model_name
        self.model_yaml_config = config
        self.system_properties = {"model_dir": str(model_dir), "gpu_id": gpu_id, "batch_size": batch_size}
        self.metrics = FakeMetrics()
        self.headers: dict[int, dict[str, str]] = {}
        self.statuses: dict[int, tuple[int, str]] = {}
        self.content_types: dict[int, str] = {}
        self.response_headers: dict[int, dict[str, str]] = {}
        self.request_ids: dict[int, str] = {}  # idx -> request id, as TorchServe sets per call
        self.stopping_criteria = None

    def get_all_request_header(self, idx: int) -> dict[str, str]:
        return self.headers.get(idx, {})

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0):
        self.statuses[idx] = (code, phrase)

    def set_response_content_type(self, idx: int, value: str):
        self.content_types[idx] = value

    def set_response_header(self, idx: int, key: str, value: str):
        self.response_headers.setdefault(idx, {})[key] = value

    def get_response_headers(self, idx: int) -> dict[str, str]:
        return self.response_headers.get(idx, {})


def extract(archive: Path, into: Path) -> Path:
    with zipfile.ZipFile(archive) as mar:
        mar.extractall(into)
    return into
