"""Which archive of a model a GPU host serves: the default, or its sibling that may take a GPU."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from serving.gpu_archive import runs_on_cpu, served_on_gpu

pytestmark = pytest.mark.unit


def mar(folder: Path, name: str, cpu: bool) -> Path:
    path = folder / name
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("model-config.yaml", "deviceType: cpu\n" if cpu else "handler: {}\n")
    return path


def test_a_default_that_pins_the_cpu_is_served_from_its_first_sibling_that_may_take_a_gpu(tmp_path):
    default = mar(tmp_path, "m.mar", cpu=True)  # an AOTInductor package compiled for this CPU
    mar(tmp_path, "m.onnx.mar", cpu=True)
    sibling = mar(tmp_path, "m.torchscript.mar", cpu=False)
    mar(tmp_path, "other.eager.mar", cpu=False)  # another model's archive is never a sibling
    assert runs_on_cpu(default) and not runs_on_cpu(sibling)
    assert served_on_gpu(default, "m") == sibling


def test_a_default_that_may_take_a_gpu_or_has_no_such_sibling_is_served_itself(tmp_path):
    free = mar(tmp_path, "a.mar", cpu=False)
    mar(tmp_path, "a.torchscript.mar", cpu=False)
    assert served_on_gpu(free, "a") == free
    pinned = mar(tmp_path, "b.mar", cpu=True)
    mar(tmp_path, "b.onnx.mar", cpu=True)
    assert served_on_gpu(pinned, "b") == pinned


def test_an_unreadable_archive_may_take_a_gpu(tmp_path):
    broken = tmp_path / "c.mar"
    broken.write_bytes(b"not a zip")
    assert not runs_on_cpu(broken)
