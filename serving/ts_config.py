"""TorchServe's config.properties, read once into frozen dataclasses.

The per-model values live in the `models=` property, a JSON object keyed by model name, then by
model version (TorchServe 0.12 looks values up with the archive's version string):

    models={"my_model": {"1.0": {"defaultVersion": true, "marName": "my_model.mar",
            "minWorkers": 1, "maxWorkers": 1, "batchSize": 8, "maxBatchDelay": 10,
            "responseTimeout": 120}}}

A `model-config.yaml` inside the .mar that sets batchSize/maxBatchDelay/minWorkers/... wins over
these values; our archives carry handler settings only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from urllib.parse import urlsplit

from build.catalogue import FRONTEND_KEYS
from build.selection import load_models_items
from handlers.plan import THREADS_KEY
from serving import properties
from serving.errors import ConfigError

# The address properties and the default TorchServe uses when one is absent.
ADDRESS_DEFAULTS = MappingProxyType(
    {
        "inference_address": "http://127.0.0.1:8080",
        "management_address": "http://127.0.0.1:8081",
        "metrics_address": "http://127.0.0.1:8082",
    }
)
# gRPC servers always start in 0.12 (no switch); these ports must be free too. Each binds its
# grpc_<api>_address, 127.0.0.1 when absent (ConfigManager.getGRPCAddress at v0.12.0).
GRPC_PORT_DEFAULTS = MappingProxyType({"grpc_inference_port": "7070", "grpc_management_port": "7071"})
GRPC_ADDRESS_DEFAULTS = MappingProxyType({"grpc_inference_address": "127.0.0.1", "grpc_management_address": "127.0.0.1"})


# What every config.properties of ours carries, whatever its source says: the management key registers
# nothing from a URL. TorchServe 0.12's workflow API (POST /workflows?url=...) ignores enable_model_api:
# it fetches a .war from any URL that allowed_urls admits (default: every file:// and http(s):// URL)
# into the workflow store (default: the model store) and starts a worker on the archive's Python
# handler. allowed_urls is a comma-separated list of regular expressions, each matched against the whole
# URL, case-insensitively (ArchiveUtils.validateURL); "(?!)" matches nothing, so every URL is refused,
# while the plain archive names of load_models are not URLs and load from the model store as before.
# The workflow store is a file, not a folder: no archive is found there and none can be copied there.
# TS_ALLOWED_URLS in the environment is read only with use_env_allowed_urls=true.
LOCKED_PROPERTIES = MappingProxyType({
    "allowed_urls": "(?!)",
    "use_env_allowed_urls": "false",
    "workflow_store": "/dev/null",
})


def lock_problems(props: Mapping[str, str]) -> list[str]:
    """'key=value (expected ...)' for each LOCKED_PROPERTIES value a configuration lacks or changes."""
    return [f"{key}={props.get(key)!r} (expected {value!r})" for key, value in LOCKED_PROPERTIES.items()
            if props.get(key) != value]


def config_text(props: Mapping[str, str], header: str = "") -> str:
    """A config.properties for a TorchServe of ours: `props`, LOCKED_PROPERTIES over them. The one
    writer of such files (tests/unit/test_security.py holds every other caller of format_properties out)."""
    return properties.format_properties({**props, **LOCKED_PROPERTIES}, header)

# ModelSettings' field for each frontend key (FRONTEND_KEYS' order).
_FIELDS = MappingProxyType(dict(zip(FRONTEND_KEYS, ("min_workers", "max_workers", "batch_size", "max_batch_delay_ms",
                                                    "response_timeout_s"))))
# What the tuner decides; responseTimeout stays as the file has it. The thread plan (THREADS_KEY)
# is written next to these.
TUNED_KEYS = FRONTEND_KEYS[:4]


@dataclass(frozen=True)
class ModelSettings:
    """The frontend's per-model values: what the tuner searches over."""

    batch_size: int = 1
    max_batch_delay_ms: int = 100
    min_workers: int = 1
    max_workers: int = 1
    response_timeout_s: int = 120
    # Intra-op threads per worker (handlers/plan.py reads it; TorchServe ignores the key). None:
    # the handler's fallback rule, which does not know about the other models on the cores.
    threads: int | None = None

    def __post_init__(self) -> None:
        for name in ("batch_size", "min_workers", "max_workers", "response_timeout_s"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.threads is not None and (isinstance(self.threads, bool) or int(self.threads) < 1):
            raise ConfigError(f"{THREADS_KEY} must be >= 1, got {self.threads}")
        if self.max_batch_delay_ms < 1:
            # TorchServe 0.12 reads 0 as "unset" and waits 100 ms for every partial batch
            # (docs/configuration.md).
            raise ConfigError(f"max_batch_delay_ms must be >= 1 (TorchServe treats 0 as 100 ms), "
                              f"got {self.max_batch_delay_ms}")
        if self.max_workers < self.min_workers:
            raise ConfigError(f"max_workers {self.max_workers} < min_workers {self.min_workers}")

    def to_json(self) -> dict[str, int]:
        out = {key: getattr(self, name) for key, name in _FIELDS.items()}
        if self.threads is not None:
            out[THREADS_KEY] = self.threads
        return out

    @classmethod
    def from_json(cls, values: Mapping[str, object]) -> ModelSettings:
        found = {name: int(values[key]) for key, name in _FIELDS.items() if key in values}
        if values.get(THREADS_KEY) is not None:
            found["threads"] = int(values[THREADS_KEY])
        return cls(**found)

    def mismatches(self, described: Mapping[str, object], keys: Sequence[str] = TUNED_KEYS) -> tuple[str, ...]:
        """'key: seen, expected' for each of `keys` where a frontend description differs from these values."""
        wanted = self.to_json()
        return tuple(f"{key}={described.get(key)!r}, expected {wanted[key]}" for key in keys
                     if described.get(key) != wanted[key])


@dataclass(frozen=True)
class ModelEntry:
    """One model of the `models=` stanza (one version, the default one)."""

    name: str
    settings: ModelSettings = field(default_factory=ModelSettings)
    version: str = "1.0"
    mar_name: str = ""

    @property
    def archive(self) -> str:
        return self.mar_name or f"{self.name}.mar"

    def to_json(self) -> dict[str, dict[str, object]]:
        body: dict[str, object] = {"defaultVersion": True, "marName": self.archive}
        body.update(self.settings.to_json())
        return {self.version: body}


def parse_models(text: str) -> tuple[ModelEntry, ...]:
    """Parse a `models=` value. Several versions of one model: the defaultVersion one is kept."""
    if not text.strip():
        return ()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"models= is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ConfigError("models= must be a JSON object {name: {version: {...}}}")
    entries = []
    for name, versions in raw.items():
        if not isinstance(versions, dict) or not versions:
            raise ConfigError(f"models= entry {name!r} must map versions to settings")
        if not all(isinstance(v, dict) for v in versions.values()):
            raise ConfigError(
                f"models= entry {name!r}: expected {{\"<version>\": {{...}}}}, the per-version form"
            )
        chosen = next(
            (v for v in versions.items() if v[1].get("defaultVersion")), next(iter(versions.items()))
        )
        version, values = chosen
        entries.append(
            ModelEntry(
                name=name,
                settings=ModelSettings.from_json(values),
                version=str(version),
                mar_name=str(values.get("marName", "")),
            )
        )
    return tuple(entries)


def format_models(entries: tuple[ModelEntry, ...]) -> str:
    return json.dumps({e.name: e.to_json() for e in entries}, separators=(", ", ": "))


DEVICES = ("cpu", "cuda")


def device_properties(device: str) -> dict[str, str]:
    """config.properties for a server whose workers run on `device`: one GPU (its gpu_id 0), or none
    at all, so that a CPU measurement on a GPU host hands no worker a GPU."""
    if device not in DEVICES:
        raise ValueError(f"device {device!r}: one of {', '.join(DEVICES)}")
    return {"number_of_gpu": "1" if device == "cuda" else "0"}


def archive_model_name(archive: Path) -> str:
    """The model name an archive registers under (its manifest's), whatever its file is called."""
    import zipfile

    try:
        with zipfile.ZipFile(archive) as mar:
            return str(json.loads(mar.read("MAR-INF/MANIFEST.json"))["model"]["modelName"])
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return archive.name.split(".")[0]  # unreadable: TorchServe will say so when it tries


def startup_archives(load_models: str, store: Path) -> dict[str, str]:
    """TorchServe's load_models: `all` (every .mar of the store), or `name=file.mar` / `file.mar` items."""
    items = load_models_items(load_models)  # the parser the build resolves load_models with
    if items is None:
        found: dict[str, list[str]] = {}
        for archive in sorted(store.glob("*.mar")):
            if not archive.name.startswith("."):  # TorchServe skips hidden files
                found.setdefault(archive_model_name(archive), []).append(archive.name)
        twice = {name: files for name, files in found.items() if len(files) > 1}
        if twice:
            name, files = next(iter(twice.items()))
            raise ConfigError(f"load_models=all would register model {name!r} from {len(files)} archives "
                              f"({', '.join(files)}: variants of one model) and keep whichever TorchServe reads "
                              f"first: list the chosen ones instead, load_models={name}={files[0]},... "
                              "(make tune writes it)")
        return {name: files[0] for name, files in found.items()}
    return {name or archive_model_name(store / url): url for name, url in items}


@dataclass(frozen=True)
class ServerConfig:
    """A config.properties file: all its properties, plus the parsed `models=` entries."""

    path: Path
    properties: Mapping[str, str]
    models: tuple[ModelEntry, ...]

    @classmethod
    def load(cls, path: Path) -> ServerConfig:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        props = properties.read(path)
        return cls(path=path, properties=MappingProxyType(props), models=parse_models(props.get("models", "")))

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.properties.get(key, default)

    def address(self, key: str) -> str:
        """Base URL of the inference/management/metrics API, without a trailing slash."""
        value = self.properties.get(key, ADDRESS_DEFAULTS[key])
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.port:
            raise ConfigError(f"{key}={value!r}: expected http(s)://host:port")
        host = parts.hostname or "127.0.0.1"
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        return f"{parts.scheme}://{host}:{parts.port}"

    def grpc_target(self, api: str = "inference") -> str:
        """host:port of the gRPC inference (or management) API, as a gRPC channel takes it."""
        host = self.properties.get(f"grpc_{api}_address", GRPC_ADDRESS_DEFAULTS[f"grpc_{api}_address"]).strip()
        port = self.properties.get(f"grpc_{api}_port", GRPC_PORT_DEFAULTS[f"grpc_{api}_port"]).strip()
        if not port.isdigit():
            raise ConfigError(f"grpc_{api}_port={port!r}: expected a port number")
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def model(self, name: str) -> ModelEntry:
        for entry in self.models:
            if entry.name == name:
                return entry
        raise ConfigError(f"model {name!r} not in models= of {self.path}")

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.models)

    def startup_archives(self, store: Path) -> dict[str, str]:
        """Model name -> archive file, for what TorchServe loads at start from `store` (load_models)."""
        return startup_archives(self.properties.get("load_models", ""), Path(store))

    def with_models(self, models: Mapping[str, ModelSettings]) -> tuple[ModelEntry, ...]:
        """The models= entries with the given settings swapped in; others kept, new ones appended."""
        out = [replace(e, settings=models[e.name]) if e.name in models else e for e in self.models]
        known = set(self.model_names)
        out += [ModelEntry(name=n, settings=s) for n, s in models.items() if n not in known]
        return tuple(out)
