"""`python -m serving.serve_wait`: after `make serve` started TorchServe from the repo root,
wait until every model of config.properties answers, then print the URLs, where the keys are
and a working curl line per model. Exit 1 (with the log tails) if it does not come up.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path

import requests

from handlers.runtime import usable_cores
from serving import processes
from serving.client import Client, Endpoints, Tokens
from serving.errors import ApiError, ConfigError, LauncherError
from serving.mix_record import read_mix
from serving.plan_check import plan_problems
from serving.repo import CATALOGUE, DEFAULT_CONFIG, MODEL_STORE, REPO_ROOT
from serving.ts_config import ServerConfig, archive_model_name


def _tail(path: Path, lines: int = 30) -> str:
    try:
        kept = [line for line in path.read_text(errors="replace").splitlines() if "ACCESS_LOG" not in line and "TS_METRICS" not in line]
    except OSError:
        return f"(no {path})"
    return f"--- tail of {path} ---\n" + "\n".join(kept[-lines:])


def _server_pid() -> int | None:
    """The pid `torchserve --start` recorded (it keeps its pid file in the temp dir)."""
    try:
        return int((Path(tempfile.gettempdir()) / ".model_server.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def served_models(config: ServerConfig) -> list:
    """What `make serve` loads: the models load_models names (with `all`, every archive of the store)."""
    return sorted(config.startup_archives(MODEL_STORE))


def check(config: ServerConfig) -> int:
    """Before the server starts: load_models resolves, each archive exists; built models left out named."""
    try:
        loaded = config.startup_archives(MODEL_STORE)
    except ConfigError as err:
        print(f"config.properties: {err}", file=sys.stderr)
        return 1
    missing = [archive for archive in loaded.values() if not (MODEL_STORE / archive).is_file()]
    if missing:
        print(f"config.properties load_models names {', '.join(missing)}, not in {MODEL_STORE}: make build "
              "(a variant the build's gate rejected is not archived: see model_store/build_report.md)", file=sys.stderr)
        return 1
    left_out = sorted({archive_model_name(p) for p in MODEL_STORE.glob("*.mar")} - set(loaded))
    for name in left_out:
        print(f"note: {name} is built but not in config.properties' load_models, so it is not served: add "
              f"{name}={name}.mar there, or run make tune MODEL={name} (it writes it)", file=sys.stderr)
    print("loading " + ", ".join(f"{n} from {a}" for n, a in loaded.items()), file=sys.stderr)
    try:
        problems = plan_problems(config, list(loaded), read_mix(config.path), usable_cores())
    except ConfigError as err:
        problems = [str(err)]
    for problem in problems:
        print(f"warning: config.properties: {problem}", file=sys.stderr)
    return 0


def wait(config: ServerConfig, workdir: Path, timeout_s: float) -> Client:
    deadline = time.monotonic() + timeout_s
    endpoints = Endpoints(
        inference=config.address("inference_address"),
        management=config.address("management_address"),
        metrics=config.address("metrics_address"),
    )
    client = None
    pending = served_models(config)
    while True:
        if time.monotonic() > deadline:
            raise LauncherError(f"not ready after {timeout_s:.0f} s (waiting for: {', '.join(pending) or 'ping'})")
        if processes.process(_server_pid()) is None:
            raise LauncherError("TorchServe is not running (it exited, or was started elsewhere)")
        try:
            if client is None and (workdir / "key_file.json").is_file():
                client = Client(endpoints, Tokens.from_key_file(workdir / "key_file.json"))
            if client is not None and client.ping(timeout_s=2).status_code == 200:
                pending = [m for m in pending if client.ready_workers(m) < 1]
                if not pending:
                    return client
        except ApiError as err:
            if err.status == 404:
                raise LauncherError(f"a model of {config.path.name} is not registered: {err}") from err
        except (requests.RequestException, LauncherError):
            pass
        time.sleep(1)


def curl_line(name: str, inference_url: str, key_file: Path) -> str:
    """A working curl line for a model: its first catalogue example as the body."""
    from build.catalogue import Catalogue
    from build.errors import BuildError
    from build.examples import CONTENT_TYPES

    key = f"""$(python3 -c 'import json; print(json.load(open("{key_file}"))["inference"]["key"])')"""
    auth = f'-H "Authorization: Bearer {key}"'
    url = f"{inference_url}/predictions/{name}"
    try:
        example = Catalogue.load(CATALOGUE).entry(name).examples[0]
    except (BuildError, IndexError):  # not a catalogue model, or no examples: the line without a body
        return f"curl {auth} {url}"
    if example.file is None:  # inline JSON or text
        body, content_type = example.request(REPO_ROOT).body.decode("utf-8"), example.content_type
    else:  # the file as it is (a photo the tools re-encode as JPEG is sent in its own format here)
        path = example.file.resolve(REPO_ROOT, "example")
        body = f"@{path}"
        content_type = CONTENT_TYPES.get(path.suffix.lower(), example.content_type)
    body = f"--data-binary {shlex.quote(body)}"
    return f"curl {auth} -H 'Content-Type: {content_type}' {body} {url}"


def grpc_line(names: list[str], target: str, key_file: Path, python: str = ".venv/bin/python") -> str | None:
    """A working Python one-liner for the gRPC API: the first served model with an inline catalogue
    example, its body in the form the family reads without a Content-Type (serving/grpc_forms.py)."""
    from build.catalogue import Catalogue
    from build.errors import BuildError
    from serving.grpc_forms import grpc_body

    for name in names:
        try:
            entry = Catalogue.load(CATALOGUE).entry(name)
            example = entry.examples[0]
            if example.file is not None:  # a file: no short literal for a one-liner
                continue
            request = example.request(REPO_ROOT)
            body = grpc_body(entry.family, request.body, request.content_type)
        except (BuildError, IndexError, ValueError):
            continue
        code = (f"from serving.grpc_client import GrpcClient; "
                f"print(GrpcClient.from_key_file({target!r}, {str(key_file)!r}).predict({name!r}, {body!r}).decode())")
        return f"{python} -c {shlex.quote(code)}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.serve_wait", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--workdir", type=Path, default=Path.cwd(), help="where torchserve was started")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--check", action="store_true", help="only check what load_models would load, then exit")
    args = parser.parse_args(argv)
    config = ServerConfig.load(args.config)
    if args.check:
        return check(config)
    workdir = args.workdir.resolve()
    print(f"waiting for TorchServe ({', '.join(served_models(config))}) ...", file=sys.stderr, flush=True)
    began = time.monotonic()
    try:
        client = wait(config, workdir, args.timeout)
    except LauncherError as err:
        print(f"TorchServe did not come up: {err}", file=sys.stderr)
        for name in ("ts_log.log", "model_log.log"):
            print(_tail(workdir / "logs" / name), file=sys.stderr)
        return 1
    key_file = workdir / "key_file.json"
    ep = client.endpoints
    print(f"\nTorchServe is up in {time.monotonic() - began:.0f} s, models: {', '.join(served_models(config))}")
    print(f"  inference   {ep.inference}/predictions/<model>   key: {key_file} -> inference.key")
    print(f"  management  {ep.management}/models               key: {key_file} -> management.key")
    print(f"  metrics     {ep.metrics}/metrics                 no key")
    print(f"  logs        {workdir / 'logs'}")
    print("\nTry:")
    for name in served_models(config):
        print(f"  {curl_line(name, ep.inference, key_file)}")
    line = grpc_line(served_models(config), config.grpc_target(), key_file)
    if line is not None:
        print(f"\ngRPC ({config.grpc_target()}, same key; docs/api.md#grpc):\n  {line}")
    print("\nStop it with: make stop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
