"""The LM engine's memory on a device: padding in the KV cache is cleared whatever it held (NaN too),
and with a KV-cache budget admission refuses what would not fit instead of running sequences out of
memory: the rest wait for room and every sequence still ends with the tokens it would have had."""

from __future__ import annotations

import pytest
import torch

from handlers.errors import OutOfMemory
from handlers.generation.kv_batch import KVBatch
from tests.unit.generation_helpers import ids_request, random_engine

pytestmark = pytest.mark.unit


def test_padding_is_cleared_even_where_it_held_nan():
    keys = torch.full((2, 1, 3, 2), float("nan"))
    keys[0, :, 1:] = 1.0
    keys[1] = 2.0
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    (k, v), = KVBatch.from_prefill([(keys, keys.clone())], mask).layers
    assert not k.isnan().any() and not v.isnan().any()
    assert k[0, :, 0].eq(0).all() and k[0, :, 1:].eq(1).all() and k[1].eq(2).all()


def test_admission_stops_at_the_kv_budget_and_everyone_still_finishes():
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
    requests = [(f"r{i}", ids_request(p, new_tokens=12, temperature=0.0)) for i, p in enumerate(prompts)]
    free = random_engine(3).generate(requests)
    engine = random_engine(3)
    longest = max(len(p) for p in prompts) + 12
    engine.kv_budget_bytes = 2 * longest * engine.kv_bytes_per_token  # two sequences at their longest
    running = []
    done = engine.generate(requests, on_step=lambda moved: running.append(len(engine.running)))
    assert max(running) == 2  # never more than the budget holds ...
    assert {k: s.generated_ids for k, s in done.items()} == {k: s.generated_ids for k, s in free.items()}  # ... all served


def test_room_counts_what_fits_beside_the_running_ones():
    engine = random_engine(4)
    waiting = [engine.new_sequence(f"w{i}", ids_request([1, 2, 3], new_tokens=7)) for i in range(5)]
    assert engine.room(waiting) == 5  # no budget: no limit
    engine.kv_budget_bytes = 3 * 10 * engine.kv_bytes_per_token
    assert engine.room(waiting) == 3
    assert engine.admit(waiting) == waiting[3:] and len(engine.running) == 3
    assert engine.room(waiting[3:]) == 0


def test_a_request_that_cannot_fit_alone_is_refused_when_it_is_made():
    engine = random_engine(5)
    engine.kv_budget_bytes = 20 * engine.kv_bytes_per_token
    with pytest.raises(OutOfMemory) as refused:
        engine.new_sequence("big", ids_request([1] * 10, new_tokens=11))
    assert refused.value.status == 507 and "fewer tokens" in refused.value.message
    engine.new_sequence("fits", ids_request([1] * 10, new_tokens=10))


def test_a_gpu_workers_kv_budget_is_a_share_of_the_free_memory(monkeypatch):
    from handlers import device

    assert device.kv_cache_budget(None) == 0 and device.kv_cache_budget(torch.device("cpu")) == 0
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (10 * 2**30, 80 * 2**30))
    assert device.kv_cache_budget(torch.device("cuda", 0)) == int(10 * 2**30 * device.KV_CACHE_SHARE)
