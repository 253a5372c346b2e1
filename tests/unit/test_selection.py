"""What `make serve` builds: config.properties' load_models resolved to catalogue entries and
variants (python -m build --for-config), and a subset build that leaves the other archives alone.

No built archives needed: it runs with --noconftest too.
"""

import json
import shutil

import pytest
import yaml

from build.__main__ import main as build_main
from build.catalogue import Catalogue
from build.errors import CatalogueError
from build.selection import for_config, load_models_items, resolve
from serving.repo import CATALOGUE, DEFAULT_CONFIG, REPO_ROOT

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def catalogue():
    return Catalogue.load(CATALOGUE)


def test_the_shipped_config_builds_the_default_archives_of_the_models_it_loads(catalogue):
    selection = for_config(catalogue, DEFAULT_CONFIG)
    assert dict(selection.variants) == {"efficientnet_lite0": ("aoti",), "minilm": ("aoti",),
                                        "digits": ("eager",), "co2": ("torchscript",)}
    assert "tinylm" not in selection.names and selection.foreign == ()


def test_a_variant_archive_names_that_variant_alone(catalogue):
    selection = resolve(catalogue, "minilm=minilm.onnx-int8.mar, co2.eager.mar")
    assert dict(selection.variants) == {"minilm": ("onnx-int8",), "co2": ("eager",)}


def test_two_archives_of_one_entry_come_in_the_entry_order(catalogue):
    selection = resolve(catalogue, "a=minilm.onnx.mar,b=minilm.mar")
    assert selection.variants["minilm"] == ("aoti", "onnx")


def test_all_asks_for_every_entry_and_variant(catalogue):
    selection = resolve(catalogue, "all")
    assert selection.names == catalogue.names
    assert selection.variants["minilm"] == ("aoti", "torchscript", "onnx", "onnx-int8", "int8")


def test_an_archive_no_entry_builds_is_left_to_the_store(catalogue):
    selection = resolve(catalogue, "mine=mine.mar,digits=digits.mar,remote=https://example.com/x.mar")
    assert dict(selection.variants) == {"digits": ("eager",)}
    assert selection.foreign == ("mine.mar", "https://example.com/x.mar")


@pytest.mark.parametrize("load_models, words", [
    ("minilm=minilm.tensorrt.mar", "minilm.tensorrt.mar is no archive of catalogue entry 'minilm' (its archives: "
                                   "minilm.mar, minilm.torchscript.mar, minilm.onnx.mar, minilm.onnx-int8.mar, minilm.int8.mar)"),
    ("minilm=minilm", "'minilm' is not a .mar file name"),
    (" ", "load_models is empty"),
])
def test_what_cannot_be_built_is_refused_by_name(catalogue, load_models, words):
    with pytest.raises(CatalogueError, match=words.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        resolve(catalogue, load_models)


def test_load_models_items_keep_torchserves_forms():
    assert load_models_items(" ALL ") is None
    assert load_models_items("a=a.mar, b.mar,,") == (("a", "a.mar"), ("", "b.mar"))


def test_a_config_without_load_models_is_refused(catalogue, tmp_path):
    (tmp_path / "config.properties").write_text("inference_address=http://127.0.0.1:8080\n")
    with pytest.raises(CatalogueError, match="no load_models= line"):
        for_config(catalogue, tmp_path / "config.properties")


def test_a_missing_example_file_of_a_served_model_is_named(catalogue, tmp_path, capsys):
    digits = yaml.safe_load(CATALOGUE.read_text())["models"]["digits"]
    digits["examples"] = [{"path": "models/digits/example_2.npy"}, {"path": "models/digits/gone.npy"}]
    (tmp_path / "catalogue.yaml").write_text(yaml.safe_dump({"models": {"digits": digits}}))
    (tmp_path / "config.properties").write_text("load_models=digits=digits.mar\n")
    shutil.copytree(REPO_ROOT / "models" / "digits", tmp_path / "models" / "digits",
                    ignore=shutil.ignore_patterns("__pycache__"))
    code = build_main(["--catalogue", str(tmp_path / "catalogue.yaml"), "--out", str(tmp_path / "store"),
                       "--for-config", str(tmp_path / "config.properties")])
    out = "".join(capsys.readouterr())
    assert code == 1 and "model 'digits' examples[1]: file not found" in out and "gone.npy" in out, out
    assert not (tmp_path / "store").exists()  # refused before anything is built


TRAINER = '''
import torch
from safetensors.torch import save_file


def train(out):
    torch.manual_seed(0)
    save_file(torch.nn.Linear(4, 3).state_dict(), str(out / "weights.safetensors"))
    return {}
'''
TINY = {"version": "1.0", "family": "tensor", "variants": ["torchscript", "eager"],
        "settings": {"tensor": {"shape": [4], "output": "softmax_topk", "top_k": 2}},
        "model": {"module": "torch.nn", "class": "Linear", "args": {"in_features": 4, "out_features": 3},
                  "weights": {"train": "mine/train_tiny.py"}},
        "examples": [{"json": {"inputs": [0.1, 0.2, 0.3, 0.4]}}]}


def test_a_subset_build_leaves_the_other_archives_and_their_state_alone(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "train_tiny.py").write_text(TRAINER)
    catalogue, store, config = tmp_path / "catalogue.yaml", tmp_path / "model_store", tmp_path / "config.properties"
    catalogue.write_text(yaml.safe_dump({"models": {"tiny": TINY}}))
    config.write_text("load_models=tiny=tiny.eager.mar\n")

    def build(*extra):
        code = build_main(["--catalogue", str(catalogue), "--out", str(store), *extra])
        out = capsys.readouterr()
        return code, out.out + out.err

    code, out = build("--for-config", str(config))
    assert code == 0, out
    assert (store / "tiny.eager.mar").is_file() and not (store / "tiny.mar").exists()
    assert "training with mine/train_tiny.py" in out  # trained when its first archive is built
    code, out = build()
    assert code == 0 and (store / "tiny.mar").is_file(), out
    assert "exporting variant eager" not in out  # the serving build's archive is up to date
    state = json.loads((store / ".build-state.json").read_text())
    default_before, default_mtime = state["tiny.mar"], (store / "tiny.mar").stat().st_mtime_ns

    catalogue.write_text(yaml.safe_dump({"models": {"tiny": {**TINY, "version": "2.0"}}}))
    code, out = build("--for-config", str(config))
    assert code == 0 and "exporting variant eager" in out and "exporting variant torchscript" not in out, out
    state = json.loads((store / ".build-state.json").read_text())
    assert state["tiny.mar"] == default_before and state["tiny.eager.mar"]["digest"] != default_before["digest"]
    assert (store / "tiny.mar").stat().st_mtime_ns == default_mtime
    report = json.loads((store / "build_report.json").read_text())["models"]["tiny"]
    assert [line["variant"] for line in report] == ["torchscript", "eager"]

    code, out = build()  # the full build catches up with the archive the subset left out
    assert code == 0 and "exporting variant torchscript" in out and "exporting variant eager" not in out, out
