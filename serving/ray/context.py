"""What an archive's handler sees of TorchServe, built for a Ray Serve replica.

The handler package inside an archive talks to TorchServe 0.12 through a context object. Until the
handler has an engine adapter of its own for Ray, a replica hands it this stand-in, built as
TorchServe's Python worker builds its own:

- at start-up: `model_name`, `manifest`, `model_yaml_config` (the archive's model-config.yaml) and
  `system_properties` (`model_dir`, `gpu_id`, `batch_size`);
- per batch: each request's headers (the HTTP headers, case-folded, plus `explain` and `url_path`,
  which TorchServe's frontend adds on its REST routes), its id, and room for the status, content
  type and headers the handler sets per request; metrics are dropped;
- each body decoded as TorchServe's worker does: `application/json` parsed, `text/*` as UTF-8, else
  bytes (what does not decode is passed on as bytes).
"""

from __future__ import annotations

import hmac
import json
import re
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml

from serving.errors import StartupError

DEFAULT_VERSION = "1.0"
_VERSION = re.compile(r"^\d+(\.\d+)*$")


@dataclass(frozen=True)
class Archive:
    """One unpacked .mar: its folder, manifest and model-config.yaml."""

    model_dir: Path
    manifest: Mapping[str, Any]
    model_config: Mapping[str, Any]

    @classmethod
    def unpack(cls, mar: Path, into: Path) -> Archive:
        try:
            with zipfile.ZipFile(mar) as archive:
                archive.extractall(into)
            manifest = json.loads((into / "MAR-INF" / "MANIFEST.json").read_text(encoding="utf-8"))
            config_file = into / "model-config.yaml"
            config = yaml.safe_load(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        except (OSError, zipfile.BadZipFile, ValueError, yaml.YAMLError) as exc:
            raise StartupError(f"{mar}: not a readable model archive ({exc}); rebuild it: .venv/bin/python -m build") from exc
        return cls(into, manifest, config or {})

    @property
    def version(self) -> str:
        return str((self.manifest.get("model") or {}).get("modelVersion", DEFAULT_VERSION))


class NullMetrics:
    """context.metrics that keeps nothing (the replica has no Prometheus sink yet)."""

    def add_time(self, *args: Any, **kwargs: Any) -> None:
        return None

    def add_counter(self, *args: Any, **kwargs: Any) -> None:
        return None

    def add_metric(self, *args: Any, **kwargs: Any) -> None:
        return None


class WorkerContext:
    """TorchServe's context for one replica (start-up) and, through `for_batch`, for one batch."""

    def __init__(self, model_name: str, archive: Archive, batch_size: int) -> None:
        self.model_name = model_name
        self.manifest = dict(archive.manifest)
        self.model_yaml_config = dict(archive.model_config)
        self.system_properties = {"model_dir": str(archive.model_dir), "gpu_id": None, "batch_size": batch_size}
        self.metrics = NullMetrics()
        self.stopping_criteria = None
        self.request_ids: dict[int, str] = {}
        self.headers: list[Mapping[str, str]] = []
        self.statuses: dict[int, tuple[int, str]] = {}
        self.content_types: dict[int, str] = {}
        self.response_headers: dict[int, dict[str, str]] = {}

    def for_batch(self, headers: Sequence[Mapping[str, str]], request_ids: Sequence[str]) -> WorkerContext:
        batch = WorkerContext.__new__(WorkerContext)
        batch.__dict__.update(self.__dict__)
        batch.headers = list(headers)
        batch.request_ids = dict(enumerate(request_ids))
        batch.statuses, batch.content_types, batch.response_headers = {}, {}, {}
        return batch

    # -- what TorchServe's handlers call ---------------------------------------------------
    def get_all_request_header(self, idx: int) -> Mapping[str, str]:
        return self.headers[idx]

    def get_request_header(self, idx: int, key: str) -> Optional[str]:
        return self.headers[idx].get(key.lower())

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        self.statuses[idx] = (code, phrase)

    def get_response_status(self, idx: int) -> tuple[int, str]:
        return self.statuses.get(idx, (200, ""))

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.content_types[idx] = value

    def get_response_content_type(self, idx: int) -> Optional[str]:
        return self.content_types.get(idx)

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        self.response_headers.setdefault(idx, {})[key] = value

    def get_response_headers(self, idx: int) -> dict[str, str]:
        return self.response_headers.get(idx, {})


def decode_body(body: bytes, content_type: str) -> Any:
    """A body as TorchServe's worker passes it to the handler (see the module's docstring)."""
    try:
        if content_type == "application/json":
            return json.loads(body.decode("utf-8"))
        if content_type.startswith("text"):
            return body.decode("utf-8")
    except ValueError:  # UnicodeDecodeError and JSONDecodeError included
        return body
    return body


def encode_answer(answer: Any) -> bytes:
    """A handler's answer as TorchServe's worker sends it: bytes as they are, text as UTF-8, else JSON."""
    if isinstance(answer, (bytes, bytearray)):
        return bytes(answer)
    if isinstance(answer, str):
        return answer.encode("utf-8")
    return json.dumps(answer, indent=2).encode("utf-8")


def url_path(path: str, prefix: str) -> str:
    """What followed /predictions/<model>[/<version>]/, as TorchServe's `url_path` header has it."""
    parts = [p for p in path[len(prefix):].split("/") if p] if path.startswith(prefix) else []
    if parts and _VERSION.match(parts[0]):
        parts = parts[1:]
    return "/".join(parts)


def authorised(header: str, key: str) -> bool:
    """An `Authorization` header carrying `Bearer <key>` (TorchServe's token auth), compared in constant time."""
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), key.encode())
