"""An archive without its weights file refuses to load with one message whatever its variant's loader
(torch.load, TorchScript, ONNX Runtime, AOTInductor each word a missing file differently): the file,
that it does not exist, and the fix."""

from __future__ import annotations

import shutil

import pytest
import yaml

from handlers.errors import ConfigError

from .conftest import make_handler

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", ["tiny_text", "tiny_image"])
def test_an_archive_without_its_weights_names_the_file_and_the_fix(tiny_dirs, tmp_path, name):
    model_dir = shutil.copytree(tiny_dirs[name], tmp_path / name)
    weights = yaml.safe_load((model_dir / "model-config.yaml").read_text())["handler"]["weights"]
    (model_dir / weights).unlink()
    with pytest.raises(ConfigError, match=rf"weights file .*/{weights} does not exist: .*rebuild it \(make build\)"):
        make_handler(model_dir, name)
