"""docs/own-model.md (the README's "Serve your own model"), step by step, with models this test
makes itself: a small CNN on 8x8 scans (family tensor, eager: the user's module travels in the
archive) and a small image classifier (family image_classifier, traced to TorchScript). Built by the same command a user runs,
served by a real TorchServe, and each answer held to the same archive run in-process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.load.inputs import photo_bytes
from build.catalogue import Catalogue
from build.export import served_settings
from serving.launcher import TorchServe
from serving.repo import REPO_ROOT
from tests.e2e.helpers import (
    assert_agree,
    assert_bad_request,
    inprocess_answers,
)

pytestmark = pytest.mark.e2e

# Step 1: the user's module.
MODULE = '''
import torch
from torch import nn


class ScanNet(nn.Module):
    """(N, 1, 8, 8) scans, values 0..16 -> 10 logits."""

    def __init__(self, width=8):
        super().__init__()
        self.conv = nn.Conv2d(1, width, 3, padding=1)
        self.head = nn.Linear(width * 64, 10)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x / 16.0)).flatten(1))


class PhotoNet(nn.Module):
    """(N, 3, 32, 32) normalised images -> 3 logits."""

    def __init__(self, classes=3):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 5, stride=2)
        self.head = nn.Linear(4 * 14 * 14, classes)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).flatten(1))
'''

# Step 2: the catalogue entries (paths relative to the catalogue's folder).
CATALOGUE = '''
models:
  scans:
    version: "1.0"
    family: tensor
    model: {python: mine/nets.py, class: ScanNet, args: {width: 8}, weights: {path: mine/scan_net.pt}}
    settings:
      tensor: {shape: [1, 8, 8], min: 0, max: 16, output: softmax_topk, top_k: 3}
    examples:
      - {path: mine/scan.npy}
      - {json: {inputs: SCAN}}
  photos:
    version: "1.0"
    family: image_classifier
    model: {python: mine/nets.py, class: PhotoNet, args: {classes: 3}, weights: {path: mine/photo_net.safetensors}}
    serialisation: torchscript
    extra_files: [{path: mine/labels.json}]
    settings:
      runtime: {precision: fp32}
      image_classifier: {image_size: 32, resize_size: 36, mean: [128], std: [64], labels: labels.json, top_k: 2}
    examples:
      - {path: mine/cat.png}
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """Steps 1 and 2: a user's folder with the module, weights, labels, examples and catalogue."""
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("own-model")
    (root / "mine").mkdir()
    (root / "mine" / "nets.py").write_text(textwrap.dedent(MODULE))
    sys.path.insert(0, str(root))
    try:
        from mine.nets import PhotoNet, ScanNet
    finally:
        sys.path.remove(str(root))
        sys.modules.pop("mine.nets", None), sys.modules.pop("mine", None)
    torch.manual_seed(0)
    torch.save(ScanNet(width=8).state_dict(), root / "mine" / "scan_net.pt")
    save_file(PhotoNet(classes=3).state_dict(), str(root / "mine" / "photo_net.safetensors"))
    (root / "mine" / "labels.json").write_text(json.dumps(["cat", "cup", "rocket"]))
    scan = np.random.default_rng(0).integers(0, 17, (1, 8, 8)).astype(np.float32)
    np.save(root / "mine" / "scan.npy", scan)
    (root / "mine" / "cat.png").write_bytes(photo_bytes()["chelsea.png"])
    (root / "catalogue.yaml").write_text(CATALOGUE.replace("SCAN", json.dumps(scan.astype(int).tolist())))
    return root


@pytest.fixture(scope="module")
def store(project):
    """Step 3: `make build`, i.e. python -m build, on the user's catalogue."""
    out = project / "model_store"
    done = subprocess.run([sys.executable, "-m", "build", "--catalogue", str(project / "catalogue.yaml"),
                           "--out", str(out)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {p.name for p in out.glob("*.mar")} == {"scans.mar", "photos.mar"}
    return out


@pytest.fixture(scope="module")
def served(store):
    """Step 4: TorchServe on the new archives (TorchServe's defaults for them: no models= entry yet).
    The repository's config.properties lists its own models in load_models; a user's store is
    served with load_models=all, as a fresh TorchServe config would."""
    with TorchServe(store, wait_for=("scans", "photos"), extra_properties={"load_models": "all"}) as ts:
        yield ts


def requests_of(project: Path, model: str) -> list:
    from build.catalogue import Catalogue

    return [e.request(project) for e in Catalogue.load(project / "catalogue.yaml").entry(model).examples]


@pytest.mark.parametrize("model", ["scans", "photos"])
def test_own_model_served_as_in_process(project, store, served, model, tmp_path):
    requests = requests_of(project, model)
    answers = []
    for r in requests:
        response = served.predict(model, r.body, r.content_type)
        assert response.status_code == 200, response.text
        answers.append(response.json())
    settings = served_settings(Catalogue.load(project / "catalogue.yaml").entry(model))
    for index, (one, other) in enumerate(zip(answers, inprocess_answers(model, requests, tmp_path, store))):
        assert_agree(settings.family, settings.family_settings, one, other, str(index))
    top = answers[0]
    assert len(top) == (3 if model == "scans" else 2) and 0 < sum(top.values()) <= 1 + 1e-6
    if model == "scans":
        assert answers[0] == answers[1]  # the .npy file and the JSON of the same scan


def test_own_model_refuses_what_its_entry_does_not_declare(served):
    assert_bad_request(served.predict("scans", {"inputs": [[1, 2], [3, 4]]}))  # shape [2, 2], not [1, 8, 8]
    assert_bad_request(served.predict("scans", {"inputs": np.full((1, 8, 8), 17).tolist()}))  # above max 16
    assert_bad_request(served.predict("photos", b"not an image", "image/png"))
