"""Speculation with a draft model (greedy output unchanged, for any weights), the prefix cache (a
hit answers as a miss does; LRU within its byte bound) and priorities inside the continuous batch
(a fake TorchServe frontend, a tiny GPT-2's archive). The trained tinylm's own draft: tests/archives."""

from __future__ import annotations

import json

import pytest
import torch

from handlers.generation.drafting import CausalLMDrafter, RecurrentDrafter
from handlers.generation.engine import Engine
from handlers.generation.prefix_cache import PrefixCache
from tests.unit.generation_helpers import (
    call,
    ids_request,
    random_engine,
    run_continuous,
)

pytestmark = pytest.mark.unit


def random_gru_drafter(seed: int, vocab: int = 211) -> RecurrentDrafter:
    from models.tinylm.draft import RecurrentDraft

    torch.manual_seed(seed)
    return RecurrentDrafter(torch.jit.script(RecurrentDraft(vocab, embed=16, hidden=24).eval()))


def random_gpt2_drafter(seed: int) -> CausalLMDrafter:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return CausalLMDrafter(GPT2LMHeadModel(GPT2Config(vocab_size=211, n_layer=1, n_head=2, n_embd=16,
                                                      n_positions=128)).eval())


def twin(engine: Engine, **kw) -> Engine:
    return Engine(engine.lm, engine.decode, engine.eos_id, engine.max_positions, **kw)


# ---- speculation with a draft model ------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 4])
@pytest.mark.parametrize("drafter", [random_gru_drafter, random_gpt2_drafter])
def test_greedy_with_a_draft_model_equals_without_on_random_weights(seed, drafter):
    engine = random_engine(seed)
    g = torch.Generator().manual_seed(seed)
    for prompt in ([1, 2, 3, 1, 2, 3], torch.randint(0, 200, (9,), generator=g).tolist(), [4]):
        plain = engine.generate([("p", ids_request(prompt, 40))])["p"]
        spec = twin(engine, drafter=drafter(seed + 100)).generate([("p", ids_request(prompt, 40))])["p"]
        assert spec.generated_ids == plain.generated_ids
        assert spec.draft.proposed > 0


def test_a_draft_model_that_agrees_with_the_target_is_accepted_whole():
    """The target as its own draft: every drafted token is its own choice, so all are kept (this
    fails if the drafter's step-back after a round is wrong)."""
    engine = random_engine(7)
    spec = twin(engine, drafter=CausalLMDrafter(engine.lm), max_draft_tokens=6)
    out = spec.generate([("p", ids_request([5, 6, 7], 60, ignore_eos=True))])["p"]
    assert out.generated_ids == engine.generate([("p", ids_request([5, 6, 7], 60, ignore_eos=True))])["p"].generated_ids
    assert out.draft.accepted == out.draft.proposed > 40


@pytest.mark.parametrize("drafter", [random_gru_drafter, random_gpt2_drafter])
def test_a_drafter_reading_round_by_round_drafts_as_one_reading_from_scratch(drafter):
    """Its step back to the last accepted token: after rounds where part of the draft was kept,
    its drafts equal those of a new drafter that reads the whole sequence at once."""
    incremental = drafter(21)
    g = torch.Generator().manual_seed(21)
    tokens = [3, 1, 4]
    for _ in range(8):
        draft = incremental.draft("s", tokens, 5)
        assert draft == drafter(21).draft("fresh", tokens, 5)
        kept = int(torch.randint(0, len(draft) + 1, (1,), generator=g))
        tokens = [*tokens, *draft[:kept], int(torch.randint(0, 200, (1,), generator=g))]


def test_two_sequences_speculating_with_a_draft_model_equal_them_alone():
    engine = random_engine(8)
    spec = twin(engine, drafter=random_gru_drafter(9))
    prompts = [[7, 8, 9, 7, 8], [3, 1, 4, 1, 5]]
    alone = [engine.generate([("x", ids_request(p, 30))])["x"].generated_ids for p in prompts]
    first, second = (spec.new_sequence(str(i), ids_request(p, 30)) for i, p in enumerate(prompts))
    spec.admit([first])
    for _ in range(3):
        spec.step()
    spec.admit([second])
    while spec.running:
        spec.step()
    assert [first.generated_ids, second.generated_ids] == alone
    assert spec.drafter.read == {}  # both forgotten when they ended


# ---- prefix cache ------------------------------------------------------------------------------
def test_a_prefix_cache_hit_answers_as_the_miss_did_and_reads_only_the_rest():
    engine = random_engine(11)
    cached = twin(engine, prefix_cache=PrefixCache(1 << 22, block=8))
    shared = list(range(1, 41))
    for tail in ([50, 51], [60], [70, 71, 72, 73, 74, 75, 76, 77, 78, 79]):
        request = ids_request(shared + tail, 20)
        hit = cached.generate([("h", request)])["h"]
        assert hit.generated_ids == engine.generate([("m", request)])["m"].generated_ids
    counts = cached.prefix_cache.take_counts()
    assert (counts.hits, counts.misses) == (2, 1) and counts.reused_tokens == 80


def test_prefix_cache_hits_and_misses_in_one_batch_equal_them_alone():
    engine = random_engine(12)
    cached = twin(engine, prefix_cache=PrefixCache(1 << 22, block=4))
    cached.generate([("warm", ids_request(list(range(1, 30)), 2))])
    prompts = [list(range(1, 30)) + [99], [5, 6, 7], list(range(1, 14)) + [42, 43]]
    alone = [engine.generate([("x", ids_request(p, 16))])["x"].generated_ids for p in prompts]
    together = cached.generate([(str(i), ids_request(p, 16)) for i, p in enumerate(prompts)])
    assert [together[str(i)].generated_ids for i in range(3)] == alone
    assert [together[str(i)].reused_tokens for i in range(3)] == [28, 0, 12]


def test_prefix_cache_stays_within_its_bytes_and_drops_the_least_recently_used():
    layers = lambda n: [(torch.zeros(1, 2, n, 4), torch.zeros(1, 2, n, 4))]  # noqa: E731 -- 64 bytes a token
    cache = PrefixCache(max_bytes=64 * 20, block=4)
    cache.store(list(range(9)), layers(9))  # keeps 8 tokens: 512 bytes
    cache.store(list(range(100, 109)), layers(9))
    assert cache.lookup(list(range(9)) + [1]) is not None  # touched: now the most recent
    cache.store(list(range(200, 209)), layers(9))  # over 1280 bytes: the least recently used goes
    assert cache.nbytes <= 64 * 20
    assert cache.lookup(list(range(100, 109))) is None and cache.lookup(list(range(200, 210))) is not None
    assert cache.take_counts().evictions == 1
    cache.store(list(range(1000, 1100)), layers(100))  # larger than the whole bound: not kept
    assert cache.nbytes <= 64 * 20


# ---- priorities ---------------------------------------------------------------------------------
@pytest.fixture
def tinylm_one_running(tiny_dirs):
    from tests.unit.conftest import make_handler

    return make_handler(tiny_dirs["tiny_lm"], "tiny_lm", batch_size=8, causal_lm={"max_running": 1})


def test_high_priority_starts_at_once_and_low_waits_its_turn_without_changing_its_answer(tinylm_one_running):
    handler, context = tinylm_one_running
    service = handler.generation
    body = {"prompt": "The for statement is used to", "max_new_tokens": 12, "ignore_eos": True}
    low = {"X-Priority": "low"}
    alone, _ = run_continuous(handler, context, {0: [("alone", body)]})
    call(handler, context, [("a", body), ("b", body)], {"a": low, "b": low})
    assert [s.key for s in service.engine.running] == ["a"] and [s.key for s in service.waiting] == ["b"]
    out, more = call(handler, context, [("a", None), ("b", None), ("h", body)], {"h": {"x-priority": "HIGH"}})
    assert {s.key for s in service.engine.running} == {"a", "h"} and [s.key for s in service.waiting] == ["b"]
    assert out[1] == b"" and more[1] is False  # waiting: an empty chunk, more to come
    answers, _ = run_continuous(handler, context, {0: [("a", None), ("b", None), ("h", None)]})
    assert json.loads(answers["b"][-1]) == json.loads(answers["h"][-1]) == json.loads(alone["alone"][-1])
    assert service.waiting == [] and service.live == {}


def test_a_bad_priority_header_is_a_400_naming_it(tinylm_one_running):
    handler, context = tinylm_one_running
    out, more = call(handler, context, [("x", {"prompt": "If"})], {"x": {"X-Priority": "urgent"}})
    assert context.statuses[0][0] == 400 and "X-Priority" in json.loads(out[0])["message"]
    assert handler.generation.live == {}


def test_the_catalogue_packs_named_files_of_a_trained_folder_and_refuses_a_bad_list():
    from build.errors import CatalogueError
    from build.sources import parse_source

    source = parse_source("m.model", {"huggingface": {"train": "models/tinylm/train.py", "also": ["draft.pt"]}})
    assert source.also == ("draft.pt",)
    with pytest.raises(CatalogueError, match="also"):
        parse_source("m.model", {"huggingface": {"train": "models/tinylm/train.py", "also": "draft.pt"}})
