"""Which archive of a model a GPU serves: its default, unless that pins the CPU.

An archive whose model-config.yaml says `deviceType: cpu` (an AOTInductor package compiled for this
CPU, an ONNX or int8 variant) never takes a GPU. A model whose default archive pins the CPU is served
on a GPU host from the store's first sibling archive (`<name>.<variant>.mar`, by name) that may take
one, where one is built: `make deploy GPU=1` serves that one, and the device check packs it.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Optional

import yaml


def runs_on_cpu(archive: Path) -> bool:
    """The archive pins its workers to the CPU (deviceType: cpu); unreadable: it may take a GPU."""
    try:
        with zipfile.ZipFile(archive) as mar:
            config = yaml.safe_load(mar.read("model-config.yaml")) or {}
    except (OSError, KeyError, zipfile.BadZipFile, yaml.YAMLError):
        return False
    return isinstance(config, dict) and str(config.get("deviceType", "")).lower() == "cpu"


def gpu_sibling(archive: Path, name: str) -> Optional[Path]:
    """The first `<name>.<variant>.mar` beside `archive` that may take a GPU; None where there is none."""
    return next((p for p in sorted(archive.parent.glob(f"{name}.*.mar")) if not runs_on_cpu(p)), None)


def served_on_gpu(archive: Path, name: str) -> Path:
    """`archive` itself unless it pins the CPU and a sibling may take a GPU: then that sibling."""
    if not runs_on_cpu(archive):
        return archive
    return gpu_sibling(archive, name) or archive
