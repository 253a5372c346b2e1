"""Security checks that need no server: weights loading refuses pickled code; the scanner works; every
TorchServe configuration we write keeps the workflow API from registering anything from a URL."""

import ast
import re
import shutil

import pytest
import torch

from benchmarks.reliability.security import (
    _is_loopback,
    handler_loader,
    payload_outcome,
    torch_load_calls,
    weights_checks,
    write_payloads,
)
from benchmarks.tune.config_writer import Update, rewrite
from deployment import __main__ as cli
from deployment import validate
from deployment.errors import ValidationFailed
from deployment.plan import PlanOptions
from serving import properties
from serving.errors import StartupError
from serving.launch_spec import LaunchSpec, locked_config
from serving.repo import REPO_ROOT
from serving.ts_config import LOCKED_PROPERTIES, ModelSettings, ServerConfig, config_text, lock_problems
from tests.mix_config import mix_record, write_mix_config

pytestmark = pytest.mark.unit


@pytest.fixture()
def payloads(tmp_path):
    marker = tmp_path / "payload-ran"
    return write_payloads(tmp_path, marker), marker


def test_each_payload_runs_under_an_unsafe_loader(payloads):
    """The red run: the check fails against torch.load(weights_only=False), so its green means something."""
    files, marker = payloads
    for kind, payload in files.items():
        refused, why = payload_outcome(lambda path: torch.load(path, weights_only=False), payload, marker)
        assert not refused and marker.exists(), (kind, why)


@pytest.mark.parametrize("graph", ["eager", "torchscript"])
def test_our_weight_loading_refuses_each_payload_without_running_it(payloads, graph):
    files, marker = payloads
    for kind, payload in files.items():
        refused, why = payload_outcome(handler_loader(graph), payload, marker)
        assert refused and not marker.exists(), (kind, why)


def test_an_error_that_is_not_a_refusal_fails_the_check(payloads):
    files, marker = payloads

    def broken(path):
        raise ImportError("no module named 'handlers'")

    refused, why = payload_outcome(broken, files["raw pickle"], marker)
    assert not refused and "ImportError is not a refusal" in why


def test_weights_checks_cover_both_payloads_and_both_graphs():
    checks = weights_checks()
    assert len(checks) == 5 and all(c.passed for c in checks), "\n".join(c.line() for c in checks)


def test_every_torch_load_in_handlers_and_build_is_weights_only():
    assert torch_load_calls() == []


def test_the_scanner_finds_unsafe_calls(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        "import torch\n"
        "a = torch." "load('x')\n"  # split: this unsafe call is the scanner's test input, not ours
        "b = torch.load('x', weights_only=False)\n"
        "c = torch.load('x', map_location='cpu', weights_only=True)\n"
    )
    assert torch_load_calls(tmp_path, ("pkg",)) == ["pkg/m.py:2", "pkg/m.py:3"]


@pytest.mark.parametrize("ip, loopback", [("127.0.0.1", True), ("::ffff:127.0.0.1", True), ("::1", True),
                                          ("0.0.0.0", False), ("::", False), ("10.1.2.3", False)])
def test_loopback_addresses(ip, loopback):
    assert _is_loopback(ip) is loopback


# -- the management key registers nothing from a URL: every config.properties we write carries the lock --

def _props_of(text: str) -> dict[str, str]:
    return properties.parse(text)


def test_the_repository_config_carries_the_lock():
    assert lock_problems(properties.read(REPO_ROOT / "config.properties")) == []


def test_the_lock_refuses_every_url_and_no_plain_archive_name():
    """allowed_urls as TorchServe 0.12 applies it (ArchiveUtils.validateURL): each comma-separated pattern
    matched against the whole URL, case-insensitively. A match would fetch the URL."""
    patterns = [re.compile(p, re.IGNORECASE) for p in LOCKED_PROPERTIES["allowed_urls"].split(",")]
    for url in ("file:///tmp/evil.war", "http://127.0.0.1:9/evil.war", "https://example.com/m.mar", "FILE:///x",
                "minilm.mar", "evil.war", ""):
        assert not any(p.fullmatch(url) for p in patterns), url


def test_a_launched_server_gets_the_lock_whatever_its_base_and_caller_say(tmp_path):
    base = tmp_path / "base.properties"
    base.write_text("allowed_urls=file://.*|http(s)?://.*\nworkflow_store=/tmp\nuse_env_allowed_urls=true\n")
    spec = LaunchSpec(model_store=tmp_path, base_config=base,
                      extra_properties={"allowed_urls": ".*", "workflow_store": str(tmp_path)})
    props = spec.properties(ServerConfig.load(base), (), (1, 2, 3, 4, 5))
    assert lock_problems(props) == []
    assert lock_problems(_props_of(config_text(props))) == []


def test_the_launcher_refuses_a_folder_config_without_the_lock(tmp_path):
    """A folder's own config.properties is served as it is (LaunchSpec.serves_folder_as_is): checked first."""
    config = tmp_path / "config.properties"
    config.write_text("inference_address=http://127.0.0.1:8080\n")
    with pytest.raises(StartupError, match="allowed_urls=None"):
        locked_config(config)
    config.write_text(config_text({"inference_address": "http://127.0.0.1:8080"}))
    assert locked_config(config).get("allowed_urls") == LOCKED_PROPERTIES["allowed_urls"]


def test_the_tuner_keeps_the_lock():
    text = (REPO_ROOT / "config.properties").read_text(encoding="utf-8")
    rewritten = rewrite(text, [Update("minilm", ModelSettings(batch_size=2, max_batch_delay_ms=3))])
    assert "batchSize" in rewritten and lock_problems(_props_of(rewritten)) == []


def test_every_deployed_config_carries_the_lock_and_validation_insists(tmp_path):
    repo = tmp_path / "repo"
    (repo / "model_store").mkdir(parents=True)
    for name in ("minilm", "efficientnet_lite0"):
        (repo / "model_store" / f"{name}.mar").write_bytes(b"PK")
    shutil.copy(REPO_ROOT / "log4j2.xml", repo / "log4j2.xml")
    config = write_mix_config(REPO_ROOT / "config.properties", repo / "config.properties", mix_record())
    config.write_text("\n".join(line for line in config.read_text().splitlines()
                                if not line.startswith(tuple(LOCKED_PROPERTIES))) + "\n")  # a source without it
    out = tmp_path / "deploy"
    cli.generate(repo, config, out, PlanOptions())
    written = [out / "image" / "config.properties", out / "kserve" / "model-root" / "config" / "config.properties"]
    for path in written:
        assert lock_problems(properties.read(path)) == [], path
    text = written[0].read_text()
    written[0].write_text(text.replace("allowed_urls=", "allowed_urls=file\\://.*|"))
    with pytest.raises(ValidationFailed, match="allowed_urls='file://.*"):
        validate.check(out, progress=lambda _: None)


def test_no_config_properties_is_written_but_through_the_locked_writer():
    """serving.ts_config.config_text puts the lock over whatever it writes; a new writer of a TorchServe
    configuration that called format_properties itself could leave it out. (tests/ copies written files
    as they are, so that a generated file that lost the lock is seen.)"""
    callers = []
    for folder in ("serving", "deployment", "benchmarks", "build", "handlers"):
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == \
                        "format_properties":
                    callers.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert [c for c in callers if not c.startswith("serving/ts_config.py:")] == []
