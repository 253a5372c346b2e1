"""Security checks: token auth, loopback binding, model API off, size and pixel limits, weights
loaded with weights_only=True, no secrets in logs or reports.

Server checks take a running TorchServe (started from the repo's config.properties); the static
ones read the repository. Each returns `Check`s: a name, whether it held, and the evidence.

    python -m benchmarks security        # starts its own server through the launcher
"""

from __future__ import annotations

import ast
import ipaddress
import pickle
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import requests

from benchmarks.load import cli
from benchmarks.load.traffic import payloads, say
from serving import properties
from serving.launcher import TorchServe
from serving.repo import DEFAULT_CONFIG, REPO_ROOT

ADDRESS_KEYS = ("inference_address", "management_address", "metrics_address")
REFUSED = (400, 401, 403)  # TorchServe 0.12 answers a missing or wrong key with 400 InvalidKeyException
SOURCE_DIRS = ("handlers", "build")


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str

    def line(self) -> str:
        return f"{'ok  ' if self.passed else 'FAIL'} {self.name}: {self.detail}"


def token_checks(ts: TorchServe, model: str) -> list[Check]:
    """Inference and management refuse no key, a wrong key and the other API's key."""
    keys = ts.tokens
    probe = payloads(model)[0]
    checks = []
    for api, own, other, other_name, call in (
        ("inference", keys.inference, keys.management, "management",
         lambda token: ts.client.predict(model, probe.body, probe.content_type, token=token, timeout_s=30)),
        ("management", keys.management, keys.inference, "inference",
         lambda token: ts.client.management("GET", "/models", token=token, timeout=30)),
    ):
        tries = {"no key": "", "a wrong key": "not-the-key-" + "0" * 20, f"the {other_name} key": other}
        answers = {label: call(token) for label, token in tries.items()}
        refused = all(r.status_code in REFUSED and "InvalidKey" in r.text for r in answers.values())
        accepted = call(own).status_code == 200
        detail = ", ".join(f"{label} -> {r.status_code}" for label, r in answers.items())
        checks.append(Check(f"{api} API refuses requests without its token", refused and accepted,
                            f"{detail}; its own key -> {'200' if accepted else 'refused!'}"))
    return checks


def loopback_checks(ts: TorchServe, config_path: Path = DEFAULT_CONFIG) -> list[Check]:
    """config.properties binds loopback; the running frontend listens on loopback only."""
    props = properties.read(config_path)
    hosts = {key: urlsplit(props.get(key, "")).hostname or "(unset)" for key in ADDRESS_KEYS}
    static_ok = all(h in ("127.0.0.1", "localhost", "::1") for h in hosts.values())
    java = psutil.Process(ts.java_pid)
    listening = sorted({(c.laddr.ip, c.laddr.port) for c in java.net_connections("inet") if c.status == psutil.CONN_LISTEN})
    public = [f"{ip}:{port}" for ip, port in listening if not _is_loopback(ip)]
    return [
        Check("config.properties binds the REST APIs to loopback", static_ok,
              ", ".join(f"{k}={v}" for k, v in hosts.items())),
        Check("the running frontend listens on loopback only", bool(listening) and not public,
              f"{len(listening)} listening sockets (REST and gRPC)" + (f"; public: {public}" if public else ", all loopback")),
    ]


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def model_api_checks(ts: TorchServe, model: str, config_path: Path = DEFAULT_CONFIG) -> list[Check]:
    """Registering or unregistering models over the management API is refused, even with the key."""
    shipped = properties.read(config_path).get("enable_model_api", "false").strip().lower()
    register = ts.client.management("POST", "/models", params={"url": f"{model}.mar"}, timeout=30).status_code
    unregister = ts.client.management("DELETE", f"/models/{model}", timeout=30).status_code
    probe = payloads(model)[0]
    still = ts.predict(model, probe.body, probe.content_type, timeout_s=30).status_code
    return [
        Check("config.properties keeps the model API off", shipped == "false", f"enable_model_api={shipped}"),
        Check("register and unregister are refused while serving", register == 405 and unregister == 405 and still == 200,
              f"POST /models -> {register}, DELETE /models/{model} -> {unregister}; {model} then answers {still}"),
    ]


def limit_checks(ts: TorchServe, model: str) -> list[Check]:
    """A body over max_request_size gets 413 from the frontend. (Each family's own limits, image
    pixel bombs included, are cases of its bad-input corpus: badinput.py.)"""
    limit = int(ts.config.get("max_request_size", "6553500") or 6553500)
    try:
        too_big = ts.predict(model, b"\0" * (limit + 1), "image/jpeg", timeout_s=60).status_code
    except requests.RequestException as exc:  # the frontend may close the connection mid-upload
        too_big = f"no answer ({type(exc).__name__})"
    return [Check("max_request_size is enforced", too_big == 413, f"{limit + 1} bytes -> {too_big}")]


def torch_load_calls(root: Path = REPO_ROOT, dirs: Sequence[str] = SOURCE_DIRS) -> list[str]:
    """Every torch.load call under `dirs` that does not pass weights_only=True ("path:line")."""
    unsafe = []
    for directory in dirs:
        for path in sorted((root / directory).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load"
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"):
                    safe = any(k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                               for k in node.keywords)
                    if not safe:
                        unsafe.append(f"{path.relative_to(root)}:{node.lineno}")
    return unsafe


# torch.load(weights_only=True) refuses with UnpicklingError, torch.jit.load with RuntimeError; any
# other exception (an ImportError in our own code, say) is not a refusal of the payload.
REFUSALS = (pickle.UnpicklingError, RuntimeError)


class _Payload:
    """Unpickling this creates a file: proof that a pickle ran code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def write_payloads(folder: Path, marker: Path) -> dict[str, Path]:
    """Weight files that run code (create `marker`) when an unsafe loader unpickles them: a raw
    pickle, and a torch.save zip (the container TorchScript archives share)."""
    import torch

    payload = {"conv.weight": _Payload(str(marker))}
    raw, archive = folder / "raw-pickle.pt", folder / "torch-save.pt"
    with open(raw, "wb") as handle:
        pickle.dump(payload, handle, protocol=2)
    torch.save(payload, archive)
    return {"raw pickle": raw, "torch.save zip": archive}


def payload_outcome(load: Callable[[Path], object], payload: Path, marker: Path) -> tuple[bool, str]:
    """(refused without running it, evidence) for one loader and one payload file."""
    marker.unlink(missing_ok=True)
    try:
        load(payload)
    except REFUSALS as exc:
        return not marker.exists(), f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
    except Exception as exc:  # noqa: BLE001 - reported as a failed check, never as a refusal
        return False, f"{type(exc).__name__} is not a refusal: {str(exc).splitlines()[0][:100]}"
    return False, "loaded" + (": the payload ran" if marker.exists() else "")


def handler_loader(graph: str) -> Callable[[Path], object]:
    """The handler's own weight loading ('eager': torch.load; 'torchscript': torch.jit.load)."""
    import torch

    from handlers.families.tensor import TensorModel, TensorSettings
    from handlers.handler import Handler
    from handlers.settings import HandlerSettings, RuntimeSettings
    from handlers.sources import ModuleSource

    def load(path: Path) -> object:
        handler = Handler()
        source = None if graph == "torchscript" else ModuleSource("torch.nn", "Linear", {"in_features": 1,
                                                                                         "out_features": 1})
        handler.settings = HandlerSettings("tensor", path.name, TensorSettings(shape=(1,)), source,
                                           RuntimeSettings(graph=graph, warmup=False))
        handler.family = TensorModel(handler.settings.family_settings, path.parent)
        handler.device = torch.device("cpu")
        return handler.load_model(path.parent)

    return load


def weights_checks() -> list[Check]:
    unsafe = torch_load_calls()
    checks = [Check("every torch.load in handlers/ and build/ passes weights_only=True", not unsafe,
                    "none without it" if not unsafe else f"without it: {', '.join(unsafe)}")]
    with tempfile.TemporaryDirectory(prefix="pickle-payload-") as tmp:
        marker = Path(tmp) / "payload-ran"
        for kind, payload in write_payloads(Path(tmp), marker).items():
            for graph in ("eager", "torchscript"):
                refused, why = payload_outcome(handler_loader(graph), payload, marker)
                checks.append(Check(f"a {kind} that runs code is refused ({graph} loading)", refused, why))
    return checks


def secrets_checks(ts: TorchServe, extra: Iterable[Path] = ()) -> list[Check]:
    """No key appears in the server's logs, config or console output, nor in the given reports."""
    keys = [k for k in (ts.tokens.inference, ts.tokens.management, ts.tokens.api) if k]
    places = [p for p in ts.workdir.rglob("*") if p.is_file() and p.name != "key_file.json" and "models" not in p.parts]
    for path in extra:
        places += [p for p in Path(path).rglob("*") if p.is_file()] if Path(path).is_dir() else [Path(path)]
    leaks = []
    for path in places:
        try:
            text = path.read_bytes()
        except OSError:
            continue
        if any(k.encode() in text for k in keys):
            leaks.append(str(path))
    return [Check("no token in logs, config, console output or reports", not leaks,
                  f"{len(places)} files scanned" + (f"; leaked in {leaks}" if leaks else ""))]


def server_checks(ts: TorchServe, model: str) -> list[Check]:
    """Every server-side check, through `model` (any served one with catalogue examples)."""
    say("security: tokens, loopback, model API, limits")
    return token_checks(ts, model) + loopback_checks(ts) + model_api_checks(ts, model) + limit_checks(ts, model)


def main(argv: Sequence[str]) -> int:
    p = cli.parser("security", __doc__.split("\n\n")[0])
    cli.add(p, "model_store", model={"help": "the model the requests go to (default: the catalogue's first)"})
    args = p.parse_args(argv)
    checks = weights_checks()
    with TorchServe(args.model_store) as ts:
        checks += server_checks(ts, cli.model_or_first(args.model)) + secrets_checks(ts)
    for check in checks:
        print(check.line())
    return 0 if all(c.passed for c in checks) else 1
