import pytest
import torch

from handlers import runtime
from handlers.errors import ConfigError
from handlers.settings import RuntimeSettings

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("threads, workers, cores, expected", [(None, 1, 2, 2), (None, 2, 2, 1), (None, 3, 2, 1),
                                                                (None, 5, 2, 1), (None, 2, 16, 8), (3, 2, 2, 3)])
def test_thread_budget_never_oversubscribes_by_default(threads, workers, cores, expected):
    """`workers` counts every loaded model's workers: five on two cores get one thread each."""
    assert runtime.thread_budget(RuntimeSettings(threads=threads), None, workers, cores)[0] == expected


def test_thread_budget_with_an_unknown_worker_count_takes_one_thread():
    assert runtime.thread_budget(RuntimeSettings(), None, None, 16) == (1, "no plan, worker count unknown")


@pytest.mark.parametrize("setting, planned, expected", [(None, 1, (1, "plan")), (3, 1, (3, "runtime.threads")),
                                                         (None, None, (2, "2 cores / 1 workers (no plan)"))])
def test_thread_budget_follows_the_written_plan(setting, planned, expected):
    """The plan beats the cores/workers rule (other models share the cores); an explicit setting beats both."""
    assert runtime.thread_budget(RuntimeSettings(threads=setting), planned, 1, 2) == expected


def test_usable_cores_within_affinity():
    import os

    assert 1 <= runtime.usable_cores() <= len(os.sched_getaffinity(0))


def test_sibling_count_outside_torchserve_is_one():
    assert runtime.sibling_worker_count() == 1


@pytest.mark.parametrize("requested, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
@pytest.mark.parametrize("supported", [True, False], ids=["cpu-supports-it", "cpu-lacks-it"])
def test_precision_resolution_cpu(monkeypatch, caplog, requested, dtype, supported):
    """Both outcomes on any CPU: the CPU's support is what the test sets, not what this machine has."""
    monkeypatch.setattr(runtime, "cpu_supports", lambda asked: supported and asked is dtype)
    resolved = runtime.resolve_precision(requested, torch.device("cpu"))
    assert resolved is (dtype if supported else None)
    assert ("falling back to fp32" in caplog.text) is not supported


def test_precision_fp32_and_unknown():
    assert runtime.resolve_precision("fp32", torch.device("cpu")) is None
    with pytest.raises(ConfigError):
        runtime.resolve_precision("fp8", torch.device("cpu"))


@pytest.mark.parametrize("flags, bf16, fp16", [
    ({"avx512_f": True, "avx512_bf16": False, "amx_bf16": False}, False, False),  # oneDNN converts: not native
    ({"avx512_f": True, "avx512_bf16": True}, True, False),
    ({"amx_bf16": True, "amx_fp16": True}, True, True),
    ({"avx512_fp16": True}, False, True),
])
def test_a_reduced_precision_counts_only_where_the_cpu_runs_it_natively(monkeypatch, flags, bf16, fp16):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: flags)
    assert (runtime.cpu_supports(torch.bfloat16), runtime.cpu_supports(torch.float16)) == (bf16, fp16)


def test_warm_up_runs_the_batch_buckets_not_every_size():
    from handlers.device import batch_buckets

    seen = []
    runtime.warm_up(seen.append, batch_buckets(24))
    assert seen == [1, 2, 4, 8, 16, 24]
    assert batch_buckets(1) == (1,) and batch_buckets(8) == (1, 2, 4, 8) and batch_buckets(128)[-1] == 128


def test_freeze_heap_takes_live_objects_out_of_full_collections():
    import gc

    try:
        kept = [[i] for i in range(1000)]
        frozen = runtime.freeze_heap()
        # Threads left by earlier tests may free a few frozen objects meanwhile; nothing unfreezes more.
        assert frozen >= len(kept) and frozen - 100 <= gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()
