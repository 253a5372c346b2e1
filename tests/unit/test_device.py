"""handlers/device.py without a GPU: where a worker is placed and how loudly it says so, batch
buckets and padding, TorchScript device constants, GPU time moved to the stage it belongs to, and
ONNX on a GPU refused with the fix when ONNX Runtime has no CUDA provider."""

from __future__ import annotations

import logging

import pytest
import torch

from handlers import device
from handlers.errors import ConfigError
from handlers.stage_metrics import StageClock, attribute_gpu_time
from serving.fake_context import FakeMetrics

pytestmark = pytest.mark.unit


def yes():
    return True


def no():
    return False


@pytest.mark.parametrize("gpu_id, wanted, cuda, where, fallback", [
    (None, "auto", no, "cpu", False),
    (0, "auto", yes, "cuda:0", False),
    (1, "gpu", yes, "cuda:1", False),
    (0, "cpu", yes, "cpu", False),  # an archive without deviceType: cpu that still says cpu
    (0, "auto", no, "cpu", True),  # handed a GPU, torch cannot use it
    (None, "gpu", yes, "cpu", True),  # a GPU archive on a host whose TorchServe hands out none
])
def test_placement(gpu_id, wanted, cuda, where, fallback, caplog):
    with caplog.at_level(logging.WARNING, logger="handlers.device"):
        placed = device.place(gpu_id, wanted, cuda)
    assert str(placed.device) == where and placed.fallback is fallback
    assert ("RUNNING ON THE CPU" in caplog.text) is fallback
    if fallback:
        assert placed.reason.startswith("FALLBACK to cpu")


def test_a_fallback_names_the_fix_and_is_a_metric():
    placed = device.place(0, "auto", no)
    assert "make venv TORCH=cuda" in placed.reason and "runtime.device: cpu" in placed.reason
    metrics = FakeMetrics()
    device.emit_placement(metrics, "m", placed)
    device.emit_placement(metrics, "m", device.place(None, "auto", no))
    assert [call[2] for call in metrics.calls if call[1] == device.FALLBACK_METRIC] == [1, 0]


def test_the_ready_line_says_where_and_why(tiny_dirs, caplog):
    from tests.inprocess import make_handler

    with caplog.at_level(logging.INFO, logger="handlers.handler"):
        handler, _ = make_handler(tiny_dirs["tiny_tensor"], "tiny_tensor", gpu_id=0)
    assert handler.placement.fallback  # no CUDA here
    assert "device=cpu (FALLBACK to cpu: TorchServe gave this worker gpu_id 0" in caplog.text


def test_buckets_and_padding():
    assert device.batch_buckets(6) == (1, 2, 4, 6)
    assert [device.bucket_for(n, (1, 2, 4, 6)) for n in (1, 3, 5, 6, 7)] == [1, 4, 6, 6, 7]
    ids, mask = torch.arange(6).reshape(3, 2), torch.ones(3, 2)
    padded = device.pad_rows((ids, mask), 4)
    assert [t.shape[0] for t in padded] == [4, 4] and padded[0][3].tolist() == [4, 5]
    assert device.pad_rows((ids,), 3)[0] is ids


def test_torchscript_device_constants_are_moved_to_the_serving_device():
    class MakesOnInputsDevice(torch.nn.Module):
        def forward(self, x):
            return x + torch.arange(x.shape[-1], device=x.device)  # traced: a constant `cpu`

    traced = torch.jit.freeze(torch.jit.trace(MakesOnInputsDevice().eval(), torch.ones(2, 3)))
    assert device.device_constants(traced) == ["cpu"]
    assert device.retarget_device_constants(traced, torch.device("cuda", 0)) == 1
    assert device.device_constants(traced) == ["cuda:0"]
    assert device.retarget_device_constants(traced, torch.device("cuda", 0)) == 0


def test_gpu_time_moves_from_postprocess_to_inference():
    clock = StageClock({"preprocess": 1.0, "inference": 0.5, "postprocess": 9.5})
    attribute_gpu_time(clock, 8.0)  # the kernels ran 8 ms; the launch returned after 0.5
    assert clock.elapsed_ms == {"preprocess": 1.0, "inference": 8.0, "postprocess": 2.0}
    attribute_gpu_time(clock, None)  # on a CPU: nothing to move
    assert clock.elapsed_ms["inference"] == 8.0
    clock = StageClock({"inference": 1.0, "postprocess": 2.0})
    attribute_gpu_time(clock, 50.0)  # never more than post-processing waited
    assert clock.elapsed_ms == {"inference": 3.0, "postprocess": 0.0}


def test_onnx_on_a_gpu_needs_the_cuda_provider():
    import onnxruntime

    assert device.check_onnx_provider(torch.device("cpu")) == "CPUExecutionProvider"
    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    with pytest.raises(ConfigError, match="install onnxruntime-gpu in place of onnxruntime"):
        device.check_onnx_provider(torch.device("cuda", 0))


def build_keys(tiny_catalogue, variant: str, runtime: dict) -> dict:
    import yaml

    from build.catalogue import parse_entry
    from build.export import device_keys, handler_section
    from build.variants import parse_variant

    raw = yaml.safe_load(tiny_catalogue.read_text())["models"]["tiny_image"]
    raw = {**raw, "settings": {**raw["settings"], "runtime": {**raw["settings"]["runtime"], **runtime}}}
    entry = parse_entry("tiny_image", raw)
    section = handler_section(entry, parse_variant("v", variant, default=False))
    return device_keys(section)


@pytest.mark.parametrize("variant, runtime, keys", [
    ("eager", {}, {}),  # auto: TorchServe places the workers
    ("torchscript", {"device": "gpu", "device_ids": [1, 2]}, {"deviceType": "gpu", "deviceIds": [1, 2]}),
    ("eager", {"device": "cpu"}, {"deviceType": "cpu"}),
    ("onnx", {}, {"deviceType": "cpu"}),  # the serve lock's ONNX Runtime runs on the CPU only
    ("onnx", {"device": "gpu"}, {"deviceType": "gpu"}),  # asked for: onnxruntime-gpu at load
    ("int8", {}, {"deviceType": "cpu"}),  # torch's dynamic int8: no CUDA kernels
])
def test_the_build_declares_where_an_archive_runs(tiny_catalogue, variant, runtime, keys):
    assert build_keys(tiny_catalogue, variant, runtime) == keys


def test_int8_on_a_gpu_is_a_build_error_naming_the_fix(tiny_catalogue):
    from build.errors import CatalogueError

    with pytest.raises(CatalogueError, match="has no CUDA kernels"):
        build_keys(tiny_catalogue, "int8", {"device": "gpu"})


def test_gpu_gauges_read_memory_per_batch_and_utilisation_at_most_once_a_second(monkeypatch):
    from tests.device_audit import virtual_cuda

    assert device.GpuGauges(torch.device("cpu")).read() == {}
    with virtual_cuda():
        reads = []
        monkeypatch.setattr(torch.cuda, "utilization", lambda d=None: reads.append(d) or 37)
        gauges = device.GpuGauges(torch.device("cuda", 0))
        first, second = gauges.read(), gauges.read()
        assert set(first) == {"GPUMemoryAllocatedMiB", "GPUMemoryReservedMiB", "GPUMemoryPeakMiB",
                              "GPUUtilizationPercent"}
        assert first["GPUUtilizationPercent"] == second["GPUUtilizationPercent"] == 37.0 and len(reads) == 1
        monkeypatch.setattr(torch.cuda, "utilization", lambda d=None: (_ for _ in ()).throw(ModuleNotFoundError("pynvml")))
        gauges = device.GpuGauges(torch.device("cuda", 0))
        assert "GPUUtilizationPercent" not in gauges.read()  # no NVML bindings: left out, never an error
