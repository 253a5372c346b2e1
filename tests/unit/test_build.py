"""Build step: catalogue validation, archive layout, incremental rebuilds, isolation of failures
(on the tiny image classifier of tests/tiny.py: real builds, in well under a second each)."""

import zipfile
from pathlib import Path

import pytest
import torch
import yaml

from build.__main__ import main as build_main
from build.archive import archived_frontend_keys
from build.catalogue import STARTUP_TIMEOUT_S, parse_entry
from build.errors import CatalogueError
from build.files import FileSource
from tests.references import decoded
from tests.tiny import catalogue_entries

pytestmark = pytest.mark.unit

# State-dict export: its weights file can be checked with torch.load.
IMAGE = catalogue_entries()["tiny_image"]
# The report's speed of each variant is timed for 1.5 s per batch size by default: not under test here.
QUICK = ("--speed-seconds", "0.01")


@pytest.fixture
def catalogue(tiny_catalogue, tmp_path) -> Path:
    """This test's catalogue file, beside the tiny models' files (a catalogue's paths are relative to its folder)."""
    return tiny_catalogue.parent / f"{tmp_path.name}.yaml"


def write_catalogue(path: Path, **entries) -> Path:
    """`path`: a catalogue file, or a folder to write catalogue.yaml in."""
    path = path / "catalogue.yaml" if path.is_dir() else path
    path.write_text(yaml.safe_dump({"models": entries}))
    return path


def run_build(catalogue: Path, store: Path, capsys, *extra):
    code = build_main(["--catalogue", str(catalogue), "--out", str(store), *QUICK, *extra])
    out = capsys.readouterr()
    return code, out.out + out.err


def with_changes(**changes):
    entry = yaml.safe_load(yaml.safe_dump(IMAGE))
    entry.update(changes)
    return entry


def test_archive_layout_and_incremental(catalogue, tmp_path, capsys):
    store = tmp_path / "store"
    write_catalogue(catalogue, img=IMAGE)
    code, out = run_build(catalogue, store, capsys)
    assert code == 0 and "built" in out
    with zipfile.ZipFile(store / "img.mar") as mar:
        names = set(mar.namelist())
        config = yaml.safe_load(mar.read("model-config.yaml"))
        assert {"handlers/handler.py", "handlers/families/image_classifier.py", "handler.py", "labels.json",
                "model.pt", "tiny_code/models.py"} <= names  # the model's code travels with its folder
        mar.extract("model.pt", tmp_path)
    assert set(config) == {"handler", "startupTimeout"} and config["handler"]["weights"] == "model.pt"
    assert config["startupTimeout"] == STARTUP_TIMEOUT_S  # TorchServe takes the archive's over config.properties
    assert config["handler"]["family"] == "image_classifier"
    assert config["handler"]["source"] == {"module": "tiny_code.models", "attribute": "TinyCNN", "args": {}}
    assert archived_frontend_keys(store / "img.mar") == []
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    assert set(state) == {"conv.weight", "conv.bias", "head.weight", "head.bias"}

    code, out = run_build(catalogue, store, capsys)
    assert code == 0 and "up to date" in out
    write_catalogue(catalogue, img=with_changes(version="2.0"))
    code, out = run_build(catalogue, store, capsys)
    assert code == 0 and "built" in out


def with_model(**changes):
    return with_changes(model={**IMAGE["model"], **changes})


def with_installed_module(module: str):
    """The same class and weights, from an installed module instead of a repository file."""
    return with_changes(model={"module": module, **{k: v for k, v in IMAGE["model"].items() if k != "python"}})


def with_family_settings(**changes):
    settings = dict(IMAGE["settings"])
    settings["image_classifier"] = {**settings["image_classifier"], **changes}
    return with_changes(settings=settings)


@pytest.mark.parametrize(
    "broken, words",
    [
        (with_changes(colour="blue"), "unknown key 'colour'"),
        (with_model(weights={"path": "no/such/weights.pt"}), "file not found"),
        (with_installed_module("not_a_module"), "does not import"),
        (with_model(**{"class": "TinyCNN.from_nowhere"}), "has no 'TinyCNN.from_nowhere'"),
        (with_model(args={"classes": 4, "colour": 1}), "cannot be called with args {'classes': 4, 'colour': 1}"),
        (with_model(args={"classes": -1}), "TinyCNN({'classes': -1}) raised RuntimeError"),  # the class itself failed
        (with_changes(settings={"batchSize": 8}), "'batchSize' does not belong"),
        (with_changes(settings={"runtime": {"precison": "bf16"}}), "unknown key 'precison'"),
        (with_model(weights={**IMAGE["model"]["weights"], "key_prefix": "net."}), "do not fit the architecture"),
        (with_family_settings(resize_size=0), "resize_size: must be >= image_size"),
        (with_family_settings(top_k=0), "top_k: must be >= 1"),
        (with_family_settings(channels=1), "fails on its family's input"),
        (with_changes(serialisation="torchscript", settings={"runtime": {"graph": "compile"}}),
         "'compile' cannot run a TorchScript archive"),
        (with_changes(family="sculpture"), "family 'sculpture' is not one of"),
        (with_changes(settings={"text_embedder": {}}), "unknown key 'text_embedder'"),
        (with_changes(examples=[{"text": "not an image"}]), "refused by the model"),
    ],
)
def test_broken_entry_named_and_others_still_built(catalogue, tmp_path, capsys, broken, words):
    store = tmp_path / "store"
    write_catalogue(catalogue, good=IMAGE, bad=broken)
    code, out = run_build(catalogue, store, capsys)
    assert code == 1
    assert "FAILED bad" in out and words in out, out
    assert (store / "good.mar").is_file() and not (store / "bad.mar").exists()


def test_failed_rebuild_keeps_previous_archive(catalogue, tmp_path, capsys):
    store = tmp_path / "store"
    write_catalogue(catalogue, img=IMAGE)
    assert run_build(catalogue, store, capsys)[0] == 0
    before = (store / "img.mar").read_bytes()
    write_catalogue(catalogue, img=with_model(weights={**IMAGE["model"]["weights"], "key_prefix": "x."}))
    code, out = run_build(catalogue, store, capsys)
    assert code == 1 and (store / "img.mar").read_bytes() == before
    assert not [p for p in store.iterdir() if p.name.startswith("build-")], "stage folder left behind"


def test_unknown_model_name_is_refused(catalogue, tmp_path, capsys):
    code, out = run_build(write_catalogue(catalogue, img=IMAGE), tmp_path / "s", capsys, "--model", "nope")
    assert code == 1 and "no model 'nope'" in out


def test_torchscript_export_serves_the_same_answers(catalogue, tmp_path, capsys, photos):
    from handlers.families import FAMILIES
    from serving.fake_context import extract

    from .conftest import make_handler

    store = tmp_path / "store"
    entries = {"eager": IMAGE, "ts": with_changes(serialisation="torchscript")}
    assert run_build(write_catalogue(catalogue, **entries), store, capsys)[0] == 0
    answers = {}
    for name in entries:
        handler, context = make_handler(extract(store / f"{name}.mar", tmp_path / name), name)
        answers[name] = decoded(handler.handle([{"body": photos["cat"]}, {"body": photos["coffee"]}], context))
    assert handler.settings.runtime.graph == "torchscript"
    for eager, traced in zip(answers["eager"], answers["ts"]):
        assert FAMILIES["image_classifier"].disagreement(None, eager, traced) is None, (eager, traced)


class Tiny(torch.nn.Module):
    """(N, 4) -> (N, 3): small enough to export in a test."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.linear(x)


TENSOR_SETTINGS = {"tensor": {"shape": [4], "output": "softmax_topk", "top_k": 2}}


@pytest.mark.parametrize("kind", ["torchscript", "exported"])
def test_torchscript_and_exported_sources(tmp_path, capsys, kind):
    """A TorchScript file is served as it is; a torch.export program is loaded at build time only and
    traced: both answer in-process as the original module does."""
    from serving.fake_context import extract

    from .conftest import make_handler

    torch.manual_seed(0)
    module, example = Tiny().eval(), torch.rand(2, 4)  # not 1: export would specialise a batch of 1
    if kind == "torchscript":
        torch.jit.save(torch.jit.trace(module, example), str(tmp_path / "tiny.ts"))
        source = {"torchscript": {"path": "tiny.ts"}}
    else:
        batch = {"x": {0: torch.export.Dim("batch", max=64)}}  # a served model takes any batch size
        torch.export.save(torch.export.export(module, (example,), dynamic_shapes=batch), str(tmp_path / "tiny.pt2"))
        source = {"exported": {"path": "tiny.pt2"}}
    entry = {"version": "1.0", "family": "tensor", "model": source, "settings": TENSOR_SETTINGS,
             "examples": [{"json": {"inputs": [0.1, 0.2, 0.3, 0.4]}}]}
    store = tmp_path / "store"
    code, out = run_build(write_catalogue(tmp_path, tiny=entry), store, capsys)
    assert code == 0, out
    handler, context = make_handler(extract(store / "tiny.mar", tmp_path / "tiny"), "tiny")
    assert handler.settings.runtime.graph == "torchscript"
    (answer,) = decoded(handler.handle([{"body": {"inputs": [0.1, 0.2, 0.3, 0.4]}}], context))
    with torch.no_grad():
        expected = module(torch.tensor([[0.1, 0.2, 0.3, 0.4]])).softmax(-1)[0]
    best = int(expected.argmax())
    assert list(answer)[0] == str(best) and abs(answer[str(best)] - float(expected[best])) < 1e-5


def test_sources_that_cannot_work_are_refused_by_name(tmp_path, capsys):
    module = Tiny().eval()
    torch.jit.save(torch.jit.trace(module, torch.rand(1, 4)), str(tmp_path / "tiny.ts"))
    eager_ts = {"version": "1.0", "family": "tensor", "model": {"torchscript": {"path": "tiny.ts"}},
                "serialisation": "state_dict", "settings": TENSOR_SETTINGS}
    bf16_ts = {**eager_ts, "serialisation": "torchscript",
               "settings": {**TENSOR_SETTINGS, "runtime": {"precision": "bf16"}}}
    code, out = run_build(write_catalogue(tmp_path, a=eager_ts, b=bf16_ts), tmp_path / "store", capsys)
    assert code == 1
    assert "FAILED a" in out and "set serialisation: torchscript" in out
    assert "FAILED b" in out and "runtime.precision: a TorchScript file runs as it was exported" in out


TRAINER = '''
import torch
from safetensors.torch import save_file


def train(out):
    torch.manual_seed(0)
    save_file(torch.nn.Linear(4, 3).state_dict(), str(out / "weights.safetensors"))
    return {"note": "trained"}
'''


def test_weights_trained_at_build_time_are_cached(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "train_tiny.py").write_text(TRAINER)
    entry = {"version": "1.0", "family": "tensor", "settings": TENSOR_SETTINGS,
             "model": {"module": "torch.nn", "class": "Linear", "args": {"in_features": 4, "out_features": 3},
                       "weights": {"train": "mine/train_tiny.py"}}}
    catalogue, store = write_catalogue(tmp_path, tiny=entry), tmp_path / "model_store"
    code, out = run_build(catalogue, store, capsys)
    assert code == 0 and "training with mine/train_tiny.py" in out and '"note": "trained"' in out, out
    code, out = run_build(catalogue, store, capsys, "--force")
    assert code == 0 and "training with" not in out, out  # cached: the script's folder did not change
    (tmp_path / "mine" / "train_tiny.py").write_text(TRAINER.replace("manual_seed(0)", "manual_seed(1)"))
    code, out = run_build(catalogue, store, capsys)
    assert code == 0 and "training with" in out, out  # the folder changed: trained again
    (tmp_path / "mine" / "train_tiny.py").write_text("def train(out):\n    return {}\n")
    code, out = run_build(catalogue, store, capsys)
    assert code == 1 and "weights.train: mine/train_tiny.py's train(out) wrote no weights.safetensors" in out, out


# -- names and paths: what an entry may name -------------------------------------------------------

@pytest.mark.parametrize("name", ["aaaaa\n", "a b", "1model", "", "a/b", "model\x00", 123])
def test_a_model_name_must_match_its_pattern_whole(name):
    with pytest.raises(CatalogueError) as caught:
        parse_entry(name, IMAGE)
    message = str(caught.value)
    assert f"model {name!r}" in message and "letters, digits" in message and "rename" in message, message


def test_a_model_name_that_matches_is_taken():
    assert parse_entry("tiny-image_2", IMAGE).name == "tiny-image_2"


ESCAPES = ["../../etc/passwd", "/etc/passwd", "models/../../etc/passwd", "C:/Windows/win.ini"]


def with_gate(path):
    return with_changes(gate={"held_out": [{"path": path}]})


# (the entry with `path` in one place, the key the error must name)
PLACES = {
    "extra_files": (lambda p: with_changes(extra_files=[{"path": p}]), "extra_files[0].path"),
    "weights": (lambda p: with_model(weights={"path": p}), "model.weights.path"),
    "python": (lambda p: with_model(python=p[:-len("passwd")] + "evil.py"), "model.python"),
    "trainer": (lambda p: with_model(weights={"train": p[:-len("passwd")] + "train.py"}), "model.weights.train"),
    "torchscript": (lambda p: with_changes(model={"torchscript": {"path": p}}, serialisation=None),
                    "model.torchscript.path"),
    "huggingface": (lambda p: {**catalogue_entries()["tiny_text"], "model": {"huggingface": {"path": p}}},
                    "model.huggingface.path"),
    "held_out": (with_gate, "gate.held_out[0].path"),
    "examples": (lambda p: with_changes(examples=[{"path": p}]), "examples[0].path"),
    "package file": (lambda p: with_changes(extra_files=[{"package": "skimage", "file": p}]), "extra_files[0].file"),
}


@pytest.mark.parametrize("escape", ESCAPES)
@pytest.mark.parametrize("place", sorted(PLACES))
def test_every_path_an_entry_names_stays_inside_the_repository(place, escape):
    make, key = PLACES[place]
    entry = {k: v for k, v in make(escape).items() if v is not None}
    with pytest.raises(CatalogueError) as caught:
        parse_entry("img", entry)
    message = str(caught.value)
    assert f"model 'img'.{key}" in message and "inside" in message, message


def test_a_symbolic_link_out_of_the_repository_is_refused(tmp_path):
    outside, root = tmp_path / "outside", tmp_path / "repo"
    outside.mkdir()
    root.mkdir()
    (outside / "secret.txt").write_text("not the repository's")
    (root / "labels.json").symlink_to(outside / "secret.txt")
    (root / "data").symlink_to(outside, target_is_directory=True)
    for path in ("labels.json", "data/secret.txt"):
        source = FileSource.parse("model 'img'.extra_files[0]", {"path": path})
        with pytest.raises(CatalogueError) as caught:
            source.resolve(root, "model 'img'.extra_files[0]")
        assert "outside the repository" in str(caught.value) and repr(path) in str(caught.value), caught.value
    (root / "inside.json").write_text("{}")
    (root / "link.json").symlink_to(root / "inside.json")
    assert FileSource.parse("x", {"path": "link.json"}).resolve(root, "x") == (root / "inside.json").resolve()


def test_an_extra_file_out_of_the_repository_is_never_packed(catalogue, tmp_path, capsys):
    store = tmp_path / "store"
    escape = {"path": "../../../../../../../../etc/passwd"}
    write_catalogue(catalogue, good=IMAGE, bad=with_changes(extra_files=[*IMAGE["extra_files"], escape]))
    code, out = run_build(catalogue, store, capsys)
    assert code == 1 and "FAILED bad" in out and "extra_files[1].path" in out, out
    assert (store / "good.mar").is_file() and not (store / "bad.mar").exists()
