"""handlers/device.py without a GPU: where a worker is placed and how loudly it says so, batch
buckets and padding, TorchScript device constants, GPU time moved to the stage it belongs to, and
ONNX on a GPU refused with the fix when ONNX Runtime has no CUDA provider."""

from __future__ import annotations

import logging

import pytest
import torch

from handlers import device
from handlers.engines.torchserve import TorchServeMetrics
from handlers.errors import ConfigError, OutOfMemory
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
def test_placement(gpu_id, wanted, cuda, where, fallback, caplog, monkeypatch):
    current = []
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    with caplog.at_level(logging.WARNING, logger="handlers.device"):
        placed = device.place(gpu_id, wanted, cuda)
    assert str(placed.device) == where and placed.fallback is fallback
    # On a GPU the worker's device becomes CUDA's current one: graphs, events, streams and ONNX
    # Runtime use it, and no context is opened on GPU 0 by a worker placed elsewhere.
    assert current == ([gpu_id] if where.startswith("cuda") else [])
    assert ("RUNNING ON THE CPU" in caplog.text) is fallback
    if fallback:
        assert placed.reason.startswith("FALLBACK to cpu")


def test_a_fallback_names_the_fix_and_is_a_metric(monkeypatch):
    placed = device.place(0, "auto", no)
    assert "make venv TORCH=cuda" in placed.reason and "runtime.device: cpu" in placed.reason
    metrics = FakeMetrics()
    sink = TorchServeMetrics(metrics)  # what the TorchServe adapter hands the handler
    device.emit_placement(sink, "m", placed)
    device.emit_placement(sink, "m", device.place(None, "auto", no))
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



class FakeNVMLError(Exception):
    """pynvml.NVMLError: an Exception, not a RuntimeError."""


def test_an_nvml_error_leaves_the_gauge_out_and_never_fails_the_batch(monkeypatch):
    import sys
    import types

    from tests.device_audit import virtual_cuda

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(NVMLError=FakeNVMLError))
    with virtual_cuda():
        monkeypatch.setattr(torch.cuda, "utilization", lambda d=None: (_ for _ in ()).throw(FakeNVMLError("GPU is lost")))
        gauges = device.GpuGauges(torch.device("cuda", 0)).read()
    assert "GPUUtilizationPercent" not in gauges and "GPUMemoryPeakMiB" in gauges


def test_the_peak_memory_gauge_is_the_batch_windows(monkeypatch):
    from tests.device_audit import virtual_cuda

    with virtual_cuda():
        peak = [300 * 2**20]
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: peak[0])
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: peak.__setitem__(0, 10 * 2**20))
        monkeypatch.setattr(torch.cuda, "utilization", lambda d=None: 0)
        gauges = device.GpuGauges(torch.device("cuda", 0))
        assert [gauges.read()["GPUMemoryPeakMiB"] for _ in range(2)] == [300.0, 10.0]


def test_onnx_on_a_gpu_names_its_device_and_a_silent_cpu_fallback_is_refused(monkeypatch, tmp_path):
    import sys
    import types

    from handlers.onnx_session import load_onnx

    made = []

    class Session:
        def __init__(self, path, options, providers, disabled_optimizers=None):
            made.append(providers)
            assert disabled_optimizers is None  # the CPU provider's rewrites are skipped on the CPU only

        def get_providers(self):
            return ["CPUExecutionProvider"]  # the CUDA libraries did not load: ONNX Runtime says nothing

    class Options:
        def add_session_config_entry(self, *a):
            pass

    fake = types.SimpleNamespace(get_available_providers=lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"],
                                 SessionOptions=Options, InferenceSession=Session,
                                 ExecutionMode=types.SimpleNamespace(ORT_SEQUENTIAL=0),
                                 GraphOptimizationLevel=types.SimpleNamespace(ORT_ENABLE_ALL=99))
    monkeypatch.setitem(sys.modules, "onnxruntime", fake)
    provider = device.check_onnx_provider(torch.device("cuda", 1))
    assert provider == ("CUDAExecutionProvider", {"device_id": 1})
    with pytest.raises(ConfigError, match="runs on \\['CPUExecutionProvider'\\]"):
        load_onnx(tmp_path / "m.onnx", 1, provider)
    assert made == [[("CUDAExecutionProvider", {"device_id": 1}), "CPUExecutionProvider"]]


class RunsOutAbove(torch.nn.Module):
    """A model whose device has room for `rows` rows at a time."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.rows, self.seen = rows, []

    def forward(self, x):
        self.seen.append(x.shape[0])
        if x.shape[0] > self.rows:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return x * 2


def test_an_out_of_memory_batch_is_its_own_507_and_the_next_runs_in_pieces():
    inner = RunsOutAbove(4)
    guarded = device.MemoryGuard(inner, torch.device("cuda", 0), max_rows=16)
    with pytest.raises(OutOfMemory) as failed:
        guarded(torch.ones(16, 3))
    assert failed.value.status == 507 and guarded.max_rows == 8
    with pytest.raises(OutOfMemory):  # pieces of 8 still too large: halved again
        guarded(torch.ones(16, 3))
    out = guarded(torch.arange(16.0).reshape(16, 1))  # now pieces of 4: served
    assert out.flatten().tolist() == [2.0 * i for i in range(16)] and inner.seen[-4:] == [4, 4, 4, 4]
    with pytest.raises(ValueError):  # anything else is not memory: raised as it is
        device.MemoryGuard(lambda x: (_ for _ in ()).throw(ValueError("bad")), torch.device("cuda", 0), 4)(
            torch.ones(2))


def test_an_out_of_memory_warm_up_stops_there_and_the_worker_lives(caplog):
    inner = RunsOutAbove(4)
    guarded = device.MemoryGuard(inner, torch.device("cuda", 0), max_rows=16)
    with caplog.at_level(logging.WARNING, logger="handlers.device"):
        device.warm_up(lambda size: guarded(torch.ones(size, 1)), (1, 2, 4, 8, 16))
    assert inner.seen == [1, 2, 4, 8] and guarded.max_rows == 4 and "warm-up stopped at batch 8" in caplog.text
    with pytest.raises(RuntimeError, match="not memory"):
        device.warm_up(lambda size: (_ for _ in ()).throw(RuntimeError("not memory")), (1,))


def test_a_torchscript_graph_on_a_gpu_warms_each_size_twice():
    seen = []
    device.warm_up(seen.append, (4, 1, 2), device.warm_calls("torchscript", torch.device("cuda", 0)))
    assert seen == [1, 1, 2, 2, 4, 4]  # the second call of a shape is where it compiles its fusions
    assert device.warm_calls("torchscript", torch.device("cpu")) == device.warm_calls("eager", torch.device("cuda")) == 1


def test_the_warm_up_runs_every_shape_of_a_size_within_its_budget(caplog):
    """Shapes per size (a text model's padded lengths); past the budget a size runs its first shape
    only, so every batch size is still warmed."""
    seen, now = [], [0.0]

    def forward(batch):
        seen.append(batch)
        now[0] += 1.0

    device.warm_up(forward, (2, 1), shapes=lambda size: [(size, w) for w in (8, 16, 24)], budget_s=100,
                   clock=lambda: now[0])
    assert seen == [(1, 8), (1, 16), (1, 24), (2, 8), (2, 16), (2, 24)]
    seen.clear()
    with caplog.at_level(logging.WARNING, logger="handlers.device"):
        device.warm_up(forward, (1, 2, 4), shapes=lambda size: [(size, w) for w in (8, 16, 24)], budget_s=1.5,
                       clock=lambda: now[0])
    assert seen == [(1, 8), (1, 16), (2, 8), (4, 8)] and "budget spent" in caplog.text
