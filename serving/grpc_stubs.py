"""Python stubs for TorchServe's gRPC inference API, generated from serving/proto/inference.proto.

The stubs are never committed: grpcio-tools' protoc writes them on first use into a git-ignored
folder (`.grpc_stubs/<hash>/` at the repository root), keyed by the proto's bytes and the
grpcio-tools version, so an edited proto or a new grpcio-tools regenerates them. `python -m
serving.grpc_stubs` generates them ahead of time and prints the folder.

    stubs = load()
    stubs.messages.PredictionsRequest(model_name="minilm", input={"data": b"..."})
    stubs.services.InferenceAPIsServiceStub(channel)
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

from serving.errors import LauncherError
from serving.repo import REPO_ROOT

PROTO = Path(__file__).resolve().parent / "proto" / "inference.proto"
STUBS_ROOT = REPO_ROOT / ".grpc_stubs"
# protoc names the modules after the proto file; the _grpc one imports the other by this name.
MESSAGES, SERVICES = "inference_pb2", "inference_pb2_grpc"


class StubsError(LauncherError):
    """The stubs could not be generated or loaded (grpcio-tools missing, protoc failed)."""


@dataclass(frozen=True)
class Stubs:
    messages: ModuleType  # inference_pb2: PredictionsRequest, PredictionResponse, TorchServeHealthResponse
    services: ModuleType  # inference_pb2_grpc: InferenceAPIsServiceStub


def _include_dir(package: str, *inside: str) -> Path:
    """The folder of an installed package (plus `inside`), for protoc's -I."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise StubsError(f"{package} is not installed: make venv (requirements/dev.txt)")
    return Path(next(iter(spec.submodule_search_locations))).joinpath(*inside)


def _includes() -> list[Path]:
    # google/protobuf/empty.proto ships inside grpcio-tools; google/rpc/status.proto inside
    # googleapis-common-protos (google.rpc's folder, two levels below the import root).
    return [PROTO.parent, _include_dir("grpc_tools", "_proto"), _include_dir("google.rpc").parent.parent]


def stubs_folder(root: Path = STUBS_ROOT) -> Path:
    digest = hashlib.sha256(PROTO.read_bytes())
    digest.update(importlib.metadata.version("grpcio-tools").encode())
    return Path(root) / digest.hexdigest()[:16]


def generate(root: Path = STUBS_ROOT) -> Path:
    """The stubs' folder, generated unless it is there already."""
    folder = stubs_folder(root)
    if (folder / f"{SERVICES}.py").is_file():
        return folder
    try:
        from grpc_tools import protoc
    except ImportError as err:
        raise StubsError(f"grpcio-tools is not installed ({err}): make venv (requirements/dev.txt)") from err
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Written into a temp folder, then renamed: two first users at once never see half the files.
    scratch = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder.parent))
    try:
        args = ["protoc", *(f"-I{p}" for p in _includes()), f"--python_out={scratch}", f"--grpc_python_out={scratch}",
                str(PROTO)]
        code = protoc.main(args)
        if code != 0 or not (scratch / f"{SERVICES}.py").is_file():
            raise StubsError(f"protoc exited {code} on {PROTO} (its message is above)")
        try:
            os.replace(scratch, folder)
        except OSError:
            if not (folder / f"{SERVICES}.py").is_file():  # not a concurrent writer that won the race
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return folder


def _load_module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise StubsError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: the services module imports the messages by name
    spec.loader.exec_module(module)
    return module


@cache
def load(root: Path = STUBS_ROOT) -> Stubs:
    """The generated modules, loaded once per process (protobuf registers each file only once)."""
    folder = generate(root)
    messages = _load_module(MESSAGES, folder / f"{MESSAGES}.py")
    return Stubs(messages=messages, services=_load_module(SERVICES, folder / f"{SERVICES}.py"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.grpc_stubs", description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=STUBS_ROOT, help="folder that holds the generated stubs")
    args = parser.parse_args(argv)
    try:
        print(generate(args.root))
    except StubsError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
