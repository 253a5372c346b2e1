"""Weights trained by a script of the repository: `weights: {train: models/digits/train.py}` in a
catalogue entry, or a whole Hugging Face folder: `huggingface: {train: models/tinylm/train.py}`.

The script defines `train(out: Path) -> dict`: it trains on data that installs offline, writes
`out/weights.safetensors` (or a Hugging Face folder: config.json, weights, tokenizer.json) and
returns its figures (held-out accuracy, perplexity, say).

Shipped: `make retrain` (python -m build.training) runs the script once and commits what it wrote
to `trained/` beside it, with `training_report.json`: the figures, a digest of the training code
(the Python files of the script's folder) and each file's sha256. `make build` then uses those
files, checked against their hashes, and trains nothing; a script changed since (a code digest that
differs) is an error that says to retrain. A script without a `trained/` folder (a model of one's
own) is trained on its first build and cached under `model_store/.trained/<script>-<digest>/`.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from build.errors import CatalogueError
from build.files import inside, relative_path

WEIGHTS = "weights.safetensors"
SHIPPED = "trained"  # beside the script: its committed output
REPORT = "training_report.json"


def training_code(script: Path) -> list[Path]:
    """What decides a script's trained weights: the Python code of its folder. Data files beside it
    (examples, held-out sets, its training report, trained/) are what it writes, not what it reads."""
    return sorted(p for p in script.parent.rglob("*.py") if p.is_file() and "__pycache__" not in p.parts)


def code_digest(script: Path) -> str:
    digest = hashlib.sha256()
    for path in training_code(script):
        digest.update(str(path.relative_to(script.parent)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def shipped_files(script: Path) -> list[Path]:
    folder = script.parent / SHIPPED
    return sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []


def trained_inputs(script: Path) -> list[Path]:
    """What an archive built from the script's weights depends on: its code and the shipped files."""
    return training_code(script) + shipped_files(script)


def trained_weights(script_path: str, root: Path, where: str, progress=print) -> Path:
    """The weights file the script trains: the shipped one, or trained and cached."""
    return trained_folder(script_path, root, where, WEIGHTS, progress) / WEIGHTS


def trained_folder(script_path: str, root: Path, where: str, expect: str, progress=print) -> Path:
    """The folder the script trains into (holding `expect`): the shipped one, checked, when the
    script has one; otherwise trained on first use and cached."""
    script = _script(script_path, root, where)
    if (script.parent / SHIPPED).is_dir():
        return check_shipped(script, root, where, expect)
    cache = root / "model_store" / ".trained" / f"{script.stem}-{_cache_key(script)}"
    if (cache / expect).is_file():
        return cache
    # Trained on the first build of an archive that needs it, never before: each script prints its
    # steps with the time so far; this says what runs and how long it took.
    progress(f"  training with {script_path} (no {SHIPPED}/ beside it; cached afterwards in {cache.relative_to(root)})")
    scratch = cache.with_name(cache.name + ".tmp")
    figures = run_training(script, root, where, scratch, expect, progress)
    scratch.rename(cache)
    report = {"script": str(script.relative_to(root)), "torch": torch.__version__, "cache": cache.name, "figures": figures}
    (script.parent / REPORT).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return cache


def check_shipped(script: Path, root: Path, where: str, expect: str) -> Path:
    """The shipped folder, when its report's code digest and file hashes hold; a CatalogueError naming
    the fix otherwise."""
    folder = script.parent / SHIPPED
    rel = script.relative_to(root)
    try:
        report = json.loads((script.parent / REPORT).read_text(encoding="utf-8"))
        recorded, files = report["code"], report["files"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CatalogueError(f"{where}: {folder.relative_to(root)} has no readable {REPORT} with code and files "
                             f"({err}): run make retrain SCRIPT={rel}") from None
    if recorded != code_digest(script):
        raise CatalogueError(f"{where}: {rel}'s folder changed since its weights in {folder.relative_to(root)} were "
                             f"trained (code digest {code_digest(script)}, trained from {recorded}): "
                             f"run make retrain SCRIPT={rel} and commit what it writes")
    present = {p.name for p in shipped_files(script)}
    if present != set(files) or expect not in present:
        raise CatalogueError(f"{where}: {folder.relative_to(root)} holds {sorted(present)}, its report lists "
                             f"{sorted(files)} (needs {expect}): run make retrain SCRIPT={rel}")
    for name, sha256 in sorted(files.items()):
        if file_sha256(folder / name) != sha256:
            raise CatalogueError(f"{where}: {folder.relative_to(root) / name} does not match the sha256 in {REPORT} "
                                 f"(changed since training): restore it (git checkout) or run make retrain SCRIPT={rel}")
    return folder


def retrain(script_path: str, root: Path, progress=print) -> dict:
    """Train once and ship: the script's output replaces `trained/` beside it, and its report
    records the figures, the code digest and each file's sha256. Returns the report."""
    script = _script(script_path, root, "retrain")
    with tempfile.TemporaryDirectory(prefix="retrain-") as tmp:
        out = Path(tmp) / SHIPPED
        figures = run_training(script, root, "retrain", out, None, progress)
        folder = script.parent / SHIPPED
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(out, folder)
    report = {"script": str(script.relative_to(root)), "torch": torch.__version__, "code": code_digest(script),
              "files": {p.name: file_sha256(p) for p in shipped_files(script)}, "figures": figures}
    (script.parent / REPORT).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    progress(f"  {folder.relative_to(root)}: {', '.join(report['files'])}; {REPORT} written")
    return report


def _script(script_path: str, root: Path, where: str) -> Path:
    script = inside(root, relative_path(f"{where}.train", script_path), f"{where}.train")
    if not script.is_file() or script.suffix != ".py":
        raise CatalogueError(f"{where}.train: {script_path!r} is not a .py file of the catalogue's folder")
    return script


def _cache_key(script: Path) -> str:
    """A cached training is also keyed by torch: another version may train other weights."""
    return hashlib.sha256(f"torch={torch.__version__} {code_digest(script)}".encode()).hexdigest()[:16]


def run_training(script: Path, root: Path, where: str, out: Path, expect: str | None = None, progress=print) -> dict:
    """Run the script's train(out) into a fresh `out`; its figures."""
    module_name = str(script.relative_to(root).with_suffix("")).replace("/", ".")
    started = time.perf_counter()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    sys.path.insert(0, str(root))
    try:
        # Loaded from the file each time: a module imported earlier may be an older version of it.
        spec = importlib.util.spec_from_file_location(module_name, script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        train = getattr(module, "train", None)
        if train is None:
            raise CatalogueError(f"{where}.train: {script.relative_to(root)} defines no train(out) function")
        figures = train(out) or {}
    finally:
        sys.path.remove(str(root))
    if expect is not None and not (out / expect).is_file():
        raise CatalogueError(f"{where}.train: {script.relative_to(root)}'s train(out) wrote no {expect}")
    progress(f"  trained in {time.perf_counter() - started:.0f} s: {json.dumps(figures)}")
    return figures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m build.training",
                                     description="Retrain and ship: a training script's output becomes trained/ "
                                                 "beside it, with training_report.json (make retrain).")
    parser.add_argument("scripts", nargs="+", help="training scripts, relative to the repository (models/*/train.py)")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    for script in args.scripts:
        print(f"retraining with {script}", flush=True)
        try:
            retrain(script, root, progress=lambda msg: print(msg, flush=True))
        except CatalogueError as err:
            print(f"retrain failed: {err}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
