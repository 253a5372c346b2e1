"""Security checks that need no server: weights loading refuses pickled code; the scanner works."""

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
