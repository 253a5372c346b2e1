"""The TorchServe frontend this worker serves, and the configuration it read at start.

A worker needs the server's config.properties (the tuned thread plan, the models that share the
cores), but TorchServe does not pass the file's path to its workers. The worker's parent is the
frontend (the JVM starts each worker directly, in the model's unpacked directory), and on Linux a
process may read its parent's command line, working directory and environment (/proc/<pid>/...).
So the worker finds the frontend among its ancestors and repeats TorchServe 0.12's own lookup
(ConfigManager's constructor):

1. the frontend's ``TS_CONFIG_FILE`` environment variable;
2. its ``-f`` / ``--ts-config-file`` argument (what ``torchserve --ts-config`` passes);
3. unless ``-ncs`` was given, the newest snapshot in ``$LOG_LOCATION/config/`` (default ``logs``):
   it then replaces the file wholesale;
4. ``config.properties`` in the frontend's working directory (``-DtsConfigFile`` may rename it).

Relative paths are resolved against the frontend's working directory, as the JVM resolves them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Optional

import psutil

from handlers import properties
from handlers.errors import ConfigError

CONFIG_ENV = "TS_CONFIG_FILE"
MAIN_CLASS = "org.pytorch.serve.ModelServer"
SNAPSHOT_DIR = "config"

# How the frontend came to read its configuration (ConfigSource.how).
FROM_ENV = CONFIG_ENV
FROM_ARGUMENT = "-f (torchserve --ts-config)"
FROM_SNAPSHOT = "snapshot"
FROM_WORKDIR = "config.properties in the frontend's working directory"
NO_FILE = "no file (TorchServe's defaults)"


@dataclass(frozen=True)
class Frontend:
    """What the worker can read of the running frontend process."""

    pid: int
    cwd: Path
    jvm_args: tuple[str, ...]     # before the main class: -D properties
    server_args: tuple[str, ...]  # after it: ModelServer's own options
    environ: Mapping[str, str]
    started: float                # epoch seconds

    def option(self, *names: str) -> Optional[str]:
        """The value after the last of `names` among ModelServer's options."""
        value = None
        for i, arg in enumerate(self.server_args[:-1]):
            if arg in names:
                value = self.server_args[i + 1]
        return value

    def flag(self, *names: str) -> bool:
        return any(arg in names for arg in self.server_args)

    def values(self, *names: str) -> tuple[str, ...]:
        """A multi-valued option (-m a b c): the values up to the next option."""
        out: list[str] = []
        taking = False
        for arg in self.server_args:
            if arg in names:
                taking = True
            elif arg.startswith("-"):
                taking = False
            elif taking:
                out.append(arg)
        return tuple(out)

    def jvm_property(self, name: str) -> Optional[str]:
        prefix = f"-D{name}="
        return next((arg[len(prefix):] for arg in reversed(self.jvm_args) if arg.startswith(prefix)), None)

    def resolve(self, path: str) -> Path:
        return (self.cwd / path) if not os.path.isabs(path) else Path(path)


@dataclass(frozen=True)
class ConfigSource:
    """The configuration the frontend started from: its file (if any), how it was chosen, its keys."""

    frontend: Frontend
    how: str
    path: Optional[Path]
    properties: Mapping[str, str]

    @property
    def is_snapshot(self) -> bool:
        return self.how == FROM_SNAPSHOT

    def describe(self) -> str:
        return f"{self.path} ({self.how})" if self.path else self.how


def split_command_line(cmdline: Sequence[str]) -> Optional[tuple[tuple[str, ...], tuple[str, ...]]]:
    """(JVM arguments, ModelServer arguments) of a frontend's command line, or None if it is not one."""
    if MAIN_CLASS not in cmdline:
        return None
    at = list(cmdline).index(MAIN_CLASS)
    return tuple(cmdline[1:at]), tuple(cmdline[at + 1:])


def find_frontend(process: Optional[psutil.Process] = None) -> Optional[Frontend]:
    """The nearest ancestor running TorchServe's frontend; None outside TorchServe (in-process use)."""
    try:
        ancestors = (process or psutil.Process()).parents()
    except psutil.Error:
        return None
    for parent in ancestors:
        try:
            split = split_command_line(parent.cmdline())
            if split is None:
                continue
            return Frontend(pid=parent.pid, cwd=Path(parent.cwd()), jvm_args=split[0], server_args=split[1],
                            environ=MappingProxyType(dict(parent.environ())), started=parent.create_time())
        except psutil.Error as exc:
            raise ConfigError(f"found TorchServe's frontend (pid {parent.pid}) but cannot read it ({exc}): "
                              "set runtime.threads in the catalogue entry, or TS_CONFIG_FILE") from exc
    return None


def snapshot_dir(frontend: Frontend) -> Path:
    location = frontend.environ.get("LOG_LOCATION") or frontend.jvm_property("LOG_LOCATION") or "logs"
    return frontend.resolve(location) / SNAPSHOT_DIR


def snapshot_read_at_start(frontend: Frontend) -> Optional[Path]:
    """The snapshot the frontend loaded: the newest one (by the timestamp that starts its name, as
    TorchServe orders them) among those written before the frontend started; later ones are its own."""
    folder = snapshot_dir(frontend)
    try:
        files = [f for f in folder.iterdir() if f.is_file() and f.stat().st_mtime < frontend.started]
    except OSError:
        return None
    stamped = [f for f in files if f.name.split("-")[0].isdigit()]
    return max(stamped, key=lambda f: f.name.split("-")[0], default=None)


def _read(path: Path, how: str) -> Mapping[str, str]:
    try:
        return MappingProxyType(properties.read(path))
    except OSError as exc:
        raise ConfigError(f"cannot read TorchServe's configuration {path} ({how}): {exc}") from exc


def locate(frontend: Frontend) -> ConfigSource:
    """The file this frontend read, found in TorchServe's own order (see the module docstring)."""
    named = frontend.environ.get(CONFIG_ENV) or None
    how = FROM_ENV
    if named is None:
        named, how = frontend.option("-f", "--ts-config-file"), FROM_ARGUMENT
    if named is None and not frontend.flag("-ncs", "--no-config-snapshot"):
        snapshot = snapshot_read_at_start(frontend)
        if snapshot is not None:
            return ConfigSource(frontend, FROM_SNAPSHOT, snapshot, _read(snapshot, FROM_SNAPSHOT))
    if named is None:
        named, how = frontend.jvm_property("tsConfigFile") or "config.properties", FROM_WORKDIR
    path = frontend.resolve(named)
    if not path.is_file():
        # TorchServe starts on its defaults when the file is missing (no models= and no plan).
        return ConfigSource(frontend, NO_FILE, None, MappingProxyType({}))
    return ConfigSource(frontend, how, path, _read(path, how))
