"""The causal-LM family in-process: KV cache == recomputation, a sequence in a batch == alone,
streamed == whole, sampling reproducible, the request checks, and the continuous-batching loop
(one step per call, by request id) with a fake TorchServe context, on random weights and on a tiny
GPT-2's archive (tests/tiny.py). What the trained tinylm's drafts accept: tests/archives."""

from __future__ import annotations

import json

import pytest
import torch

from handlers.errors import BadInput, PayloadTooLarge
from handlers.generation.drafting import LookupDrafter
from handlers.generation.engine import Engine
from handlers.generation.params import Limits, parse_request
from handlers.generation.text import TextStream
from tests.unit.conftest import make_handler
from tests.unit.generation_helpers import (
    call,
    ids_request,
    random_engine,
    run_continuous,
)

pytestmark = pytest.mark.unit

PROMPTS = ["The for statement is used to", "A class definition", "Names refer to objects.",
           "The import statement", "If the syntax", "Exceptions are"]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kv_cache_equals_recomputation_on_random_weights(seed):
    engine = random_engine(seed)
    g = torch.Generator().manual_seed(seed)
    for length in (1, 5, 17):
        prompt = torch.randint(0, 200, (length,), generator=g).tolist()
        cached = engine.generate([("a", ids_request(prompt))])["a"]
        recomputed = engine.generate_without_cache(ids_request(prompt))
        assert cached.text.ids == recomputed.text.ids


def test_sequences_joining_a_running_batch_match_their_runs_alone():
    engine = random_engine(3)
    prompts = [[1, 2, 3], [9] * 20, [5], list(range(30, 41))]
    alone = [engine.generate([("x", ids_request(p, 16))])["x"].text.ids for p in prompts]
    seqs = [engine.new_sequence(str(i), ids_request(p, 16)) for i, p in enumerate(prompts)]
    engine.admit(seqs[:1])
    for i, seq in enumerate(seqs[1:], start=1):  # each joins a batch already mid-generation
        for _ in range(i * 2):
            engine.step()
        engine.admit([seq])
    while engine.running:
        engine.step()
    assert [s.text.ids for s in seqs] == alone
    assert engine.kv is None and engine.cache_bytes == 0  # every finished sequence freed its rows


def test_dropped_sequence_frees_its_rows_and_the_rest_go_on():
    engine = random_engine(4)
    alone = engine.generate([("b", ids_request([7, 8, 9], 12))])["b"].text.ids
    a, b = engine.new_sequence("a", ids_request([1] * 40, 40)), engine.new_sequence("b", ids_request([7, 8, 9], 12))
    engine.admit([a, b])
    engine.step()
    before = engine.cache_bytes
    assert [s.key for s in engine.drop(["a"])] == ["a"]
    assert engine.cache_bytes < before / 2 and [s.key for s in engine.running] == ["b"]
    while engine.running:
        engine.step()
    assert b.text.ids == alone


def test_text_stream_pieces_add_up_and_stop_strings_cut():
    vocab = {0: "Hel", 1: "lo", 2: " wor", 3: "ld", 4: "\n\n", 5: "Next"}
    stream = TextStream(lambda ids: "".join(vocab[i] for i in ids), stop=("\n\n",))
    pieces = []
    for token in (0, 1, 2, 3, 4, 5):
        stream.add(token)
        pieces.append(stream.take(final=stream.stopped))
        if stream.stopped:
            break
    assert "".join(pieces) == "Hello world" == stream.text


def test_text_stream_holds_back_an_incomplete_character():
    stream = TextStream(lambda ids: "ab\ufffd" if ids == [0] else "abé")
    stream.add(0)
    assert stream.take(final=False) == "ab"
    stream.add(1)
    assert stream.take(final=True) == "é"


LIMITS = Limits(max_prompt_tokens=8, max_new_tokens=32, default_max_new_tokens=16)


def encode_words(text):
    return list(range(len(text.split())))


@pytest.mark.parametrize("body, field", [
    ({"prompt": ""}, '"prompt"'),
    ({"prompt": 5}, '"prompt"'),
    ({"prompt": "a", "max_new_tokens": 0}, '"max_new_tokens"'),
    ({"prompt": "a", "max_new_tokens": 33}, '"max_new_tokens"'),
    ({"prompt": "a", "max_new_tokens": True}, '"max_new_tokens"'),
    ({"prompt": "a", "temperature": -1}, '"temperature"'),
    ({"prompt": "a", "temperature": "hot"}, '"temperature"'),
    ({"prompt": "a", "top_p": 0}, '"top_p"'),
    ({"prompt": "a", "top_k": -3}, '"top_k"'),
    ({"prompt": "a", "seed": -1}, '"seed"'),
    ({"prompt": "a", "stop": [""]}, '"stop"'),
    ({"prompt": "a", "stop": ["x"] * 5}, '"stop"'),
    ({"prompt": "a", "stream": "yes"}, '"stream"'),
    ({"prompt": "a", "max_tokens": 5}, '"max_tokens"'),
    (["a"], "JSON object"),
])
def test_bad_parameters_name_the_field(body, field):
    with pytest.raises(BadInput) as caught:
        parse_request(body, encode_words, LIMITS)
    assert caught.value.status == 400 and field in caught.value.message


def test_a_prompt_over_the_limit_is_413():
    with pytest.raises(PayloadTooLarge, match="tokens"):
        parse_request({"prompt": "a " * 9}, encode_words, LIMITS)


def test_a_huge_prompt_is_refused_before_it_is_tokenised():
    def never(text):
        raise AssertionError("tokenised")

    with pytest.raises(PayloadTooLarge, match="characters"):
        parse_request({"prompt": "x" * 70_000}, never, LIMITS)


# ---- a tiny GPT-2's archive through the handler ------------------------------------------------
# "ignore_eos" where a test counts tokens or compares long texts: random weights may pick the
# end-of-text token at any step.
@pytest.fixture(scope="module")
def tinylm(tiny_dirs):
    return make_handler(tiny_dirs["tiny_lm"], "tiny_lm", batch_size=4)


def test_served_model_greedy_with_cache_equals_recompute(tinylm):
    handler, _ = tinylm
    engine, family = handler.generation.engine, handler.family
    for prompt in PROMPTS[:3]:
        request = family.decode({"prompt": prompt, "max_new_tokens": 48, "ignore_eos": True}, "")
        assert engine.generate([("k", request)])["k"].text.ids == engine.generate_without_cache(request).text.ids


def test_sampling_with_a_seed_repeats_whatever_shares_the_batch(tinylm):
    handler, _ = tinylm
    engine, family = handler.generation.engine, handler.family
    sampled = family.decode({"prompt": PROMPTS[0], "temperature": 0.9, "top_k": 40, "top_p": 0.95, "seed": 11}, "")
    alone = engine.generate([("s", sampled)])["s"].text.text
    other = family.decode({"prompt": PROMPTS[1]}, "")
    assert engine.generate([("o", other), ("s", sampled)])["s"].text.text == alone


def test_openai_routes_on_a_step_mode_archive_get_a_404_naming_the_async_mode_and_the_batch_goes_on(tinylm):
    handler, context = tinylm
    body = {"prompt": PROMPTS[0], "max_new_tokens": 4, "ignore_eos": True}
    answers, _ = run_continuous(handler, context, {0: [("openai", {"model": "tiny_lm", "prompt": "Hi"}), ("plain", body)]},
                                headers={"openai": {"url_path": "v1/completions"}})
    error = json.loads(answers["openai"][-1])["error"]
    assert "causal_lm.mode: async" in error["message"]
    assert json.loads(answers["plain"][-1])["generated_tokens"] == 4


def test_continuous_batching_answers_equal_the_requests_alone_and_streamed_equals_whole(tinylm):
    handler, context = tinylm
    bodies = {f"r{i}": {"prompt": p, "max_new_tokens": 20 + 3 * i, "ignore_eos": True}
              for i, p in enumerate(PROMPTS[:4])}
    alone = {}
    for rid, body in bodies.items():
        answers, flags = run_continuous(handler, context, {0: [(rid, body)]})
        alone[rid] = json.loads(answers[rid][-1])
        assert flags[rid][-1] is True and all(f is False for f in flags[rid][:-1])
        assert all(a == b"" for a in answers[rid][:-1])  # a whole answer: empty chunks until it is done
    staggered = {0: [("r0", bodies["r0"])], 3: [("r1", bodies["r1"]), ("r2", bodies["r2"])], 7: [("r3", bodies["r3"])]}
    answers, _ = run_continuous(handler, context, staggered)
    assert {rid: json.loads(a[-1]) for rid, a in answers.items()} == alone
    streamed, _ = run_continuous(handler, context, {0: [("s", {**bodies["r2"], "stream": True})]})
    lines = [json.loads(line) for chunk in streamed["s"] for line in chunk.decode().splitlines()]
    assert "".join(line["text"] for line in lines) == alone["r2"]["text"]
    assert lines[-1]["finish_reason"] == alone["r2"]["finish_reason"]
    assert handler.generation.engine.running == [] and handler.generation.live == {}


def test_bad_request_in_a_running_batch_gets_400_and_the_others_go_on(tinylm):
    handler, context = tinylm
    out, more = call(handler, context, [("good", {"prompt": PROMPTS[0], "max_new_tokens": 5, "ignore_eos": True}),
                                        ("bad", {"prompt": PROMPTS[0], "temperature": -2})])
    assert context.statuses[1][0] == 400 and "temperature" in json.loads(out[1])["message"]
    assert more == [False, None]  # the 400 goes out whole, at once; the good one runs on
    answers, _ = run_continuous(handler, context, {0: [("good", None)]})
    assert json.loads(answers["good"][-1])["generated_tokens"] == 5


def test_a_request_the_frontend_stops_sending_is_released(tinylm):
    handler, context = tinylm
    call(handler, context, [("leaver", {"prompt": PROMPTS[1], "max_new_tokens": 60, "stream": True,
                                        "ignore_eos": True}),
                            ("stayer", {"prompt": PROMPTS[2], "max_new_tokens": 3, "ignore_eos": True})])
    assert context.metrics.last("GenerationRunningSequences") == 2
    call(handler, context, [("stayer", None)])  # the leaver's client disconnected
    assert "leaver" not in handler.generation.live
    assert context.metrics.last("GenerationRunningSequences") == 1
    assert context.metrics.last("GenerationReleasedOnDisconnect") == 1
    run_continuous(handler, context, {0: [("stayer", None)]})
    assert context.metrics.last("GenerationRunningSequences") == 0


def test_a_second_continuous_batching_worker_is_refused(tiny_dirs, monkeypatch):
    from handlers import runtime
    from handlers.errors import ConfigError

    monkeypatch.setattr(runtime, "sibling_worker_count", lambda: 2)
    with pytest.raises(ConfigError, match="one worker"):
        make_handler(tiny_dirs["tiny_lm"], "tiny_lm")


def test_a_fault_in_the_model_ends_every_sequence_with_500_and_the_worker_serves_on(tinylm, monkeypatch):
    handler, context = tinylm
    engine = handler.generation.engine
    call(handler, context, [("a", {"prompt": PROMPTS[0], "max_new_tokens": 50, "stream": True,
                                   "ignore_eos": True})])

    def broken(*args, **kwargs):
        raise RuntimeError("simulated kernel failure")

    with monkeypatch.context() as patch:
        patch.setattr(engine, "_forward", broken)
        out, more = call(handler, context, [("a", None), ("b", {"prompt": PROMPTS[1]})])
    assert [context.statuses[i][0] for i in (0, 1)] == [500, 500]
    assert more == [True, None]  # a's stream ends with the error; b's 500 goes out whole
    assert engine.running == [] and engine.kv is None and handler.generation.live == {}
    answers, _ = run_continuous(handler, context, {0: [("c", {"prompt": PROMPTS[2], "max_new_tokens": 4,
                                                            "ignore_eos": True})]})
    assert json.loads(answers["c"][-1])["generated_tokens"] == 4


# ---- speculative decoding by prompt lookup ------------------------------------------------------
def test_lookup_draft_takes_what_followed_the_last_ngram():
    from handlers.generation.speculation import lookup_draft

    assert lookup_draft([1, 2, 3, 9, 9, 1, 2, 3], 3) == [9, 9, 1]
    assert lookup_draft([5, 6, 7, 5], 2) == [6, 7]  # only a 1-gram recurs
    assert lookup_draft([1, 2, 3], 4) == []


def lookup_twin(engine: Engine) -> Engine:
    return Engine(engine.lm, engine.decode, engine.eos_id, engine.max_positions, drafter=LookupDrafter())


@pytest.mark.parametrize("seed", [0, 5])
def test_greedy_with_lookup_equals_without_on_random_weights(seed):
    engine = random_engine(seed)
    g = torch.Generator().manual_seed(seed)
    for prompt in ([1, 2, 3, 1, 2, 3, 1, 2], torch.randint(0, 200, (12,), generator=g).tolist(), [4] * 6):
        plain = engine.generate([("p", ids_request(prompt, 40))])["p"]
        spec = lookup_twin(engine).generate([("p", ids_request(prompt, 40))])["p"]
        assert spec.generated_ids == plain.generated_ids
        assert spec.draft.proposed > 0  # the drafts were tried, not skipped


def test_lookup_with_two_sequences_joining_each_other_equals_them_alone():
    engine = random_engine(6)
    speculative = lookup_twin(engine)
    prompts = [[7, 8, 9, 7, 8, 9, 7], [3, 1, 4, 1, 5, 9, 2, 6]]
    alone = [engine.generate([("x", ids_request(p, 30))])["x"].generated_ids for p in prompts]
    first, second = (speculative.new_sequence(str(i), ids_request(p, 30)) for i, p in enumerate(prompts))
    speculative.admit([first])
    for _ in range(3):
        speculative.step()
    speculative.admit([second])
    while speculative.running:
        speculative.step()
    assert [first.generated_ids, second.generated_ids] == alone


def test_profiler_traces_generation_steps(tiny_dirs, monkeypatch, tmp_path):
    monkeypatch.setenv("ENABLE_TORCH_PROFILER", "true")
    handler, context = make_handler(tiny_dirs["tiny_lm"], "tiny_lm", profiler={"trace_dir": str(tmp_path)})
    run_continuous(handler, context, {0: [("p", {"prompt": PROMPTS[0], "max_new_tokens": 8})]})
    traces = list((tmp_path / "tiny_lm").glob("trace-*.json"))
    assert traces and "generation_step" in traces[0].read_text()
