"""Device placement without a GPU: every family's handler and the generation engine run as a worker
given `gpu_id: 0` would, under tests/device_audit.py's virtual CUDA, and fail where a tensor is made
on the host next to a model on the device (CUDA would refuse the operation). Answers must equal the
CPU's (the virtual device is the CPU underneath: any difference is a placement bug too)."""

from __future__ import annotations

import json

import pytest
import torch

from handlers import device
from tests.device_audit import DeviceMix, virtual_cuda
from tests.inprocess import make_handler
from tests.unit.generation_helpers import ids_request, random_engine

pytestmark = pytest.mark.unit

REQUEST_FAMILIES = ("tiny_image", "tiny_text", "tiny_tensor", "tiny_forecast")


def test_the_audit_refuses_a_host_tensor_next_to_a_device_one():
    with virtual_cuda():
        on_device = torch.ones(3, device="cuda")
        assert on_device.device == torch.device("cuda", 0) and on_device.is_cuda
        with pytest.raises(DeviceMix, match="add"):
            _ = on_device + torch.ones(3)
        assert (on_device + torch.tensor(2.0)).tolist() == [3.0, 3.0, 3.0]  # a 0-dim scalar may cross
        assert (on_device.cpu() + torch.ones(3)).tolist() == [2.0, 2.0, 2.0]
        linear = torch.nn.Linear(3, 2).to("cuda")
        with pytest.raises(DeviceMix, match="linear"):
            linear(torch.ones(1, 3))
        assert linear(torch.ones(1, 3).to("cuda")).is_cuda
        with pytest.raises(DeviceMix, match="numpy"):
            on_device.numpy()


def answers_of(handler, context, bodies):
    data = [{"body": body} for body in bodies]
    return [json.loads(answer) for answer in handler.handle(data, context)], dict(context.statuses)


@pytest.mark.parametrize("model", REQUEST_FAMILIES)
def test_each_family_serves_on_a_gpu_id_with_the_cpus_answers(tiny_dirs, tiny_catalogue, model):
    from build.catalogue import Catalogue

    entry = Catalogue.load(tiny_catalogue).entry(model)
    bodies = [example.request(tiny_catalogue.parent).body for example in entry.examples]
    cpu_handler, cpu_context = make_handler(tiny_dirs[model], model, batch_size=4)
    expected, _ = answers_of(cpu_handler, cpu_context, bodies)
    with virtual_cuda() as audit:
        handler, context = make_handler(tiny_dirs[model], model, batch_size=4, gpu_id=0)
        assert handler.device == torch.device("cuda", 0)
        assert audit.marked(next(handler.model.parameters())), "the model is on the device"
        answers, statuses = answers_of(handler, context, bodies)
    assert not statuses, statuses
    for one, other in zip(answers, expected):
        assert handler.family.disagreement(handler.family.settings, one, other) is None, (one, other)


def generate(engine, *requests):
    return {key: seq.generated_ids for key, seq in engine.generate(list(requests)).items()}


def test_the_generation_engine_places_every_tensor_on_the_models_device():
    requests = [("greedy", ids_request([5, 6, 7, 8], 12)),
                ("sampled", ids_request([9, 10, 11], 12, temperature=0.8, top_k=20, top_p=0.9, seed=3)),
                ("short", ids_request([12], 3))]
    expected = generate(random_engine(0), *requests)
    with virtual_cuda():
        engine = random_engine(0)
        engine.lm.to(device.place(0, "auto").device)
        engine.device = next(engine.lm.parameters()).device  # what Engine() takes by default
        assert engine.device.type == "cuda"
        assert generate(engine, *requests) == expected
        # Sequences joining a running batch, and leaving it, move the KV cache's rows on the device.
        first = engine.new_sequence("first", ids_request([1, 2, 3], 6))
        engine.admit([first])
        engine.step()
        engine.admit([engine.new_sequence("second", ids_request([4, 5], 6))])
        while engine.running:
            engine.step()


@pytest.mark.parametrize("feature", ["prefix_cache", "lookup", "gru_draft"])
def test_the_engines_prefix_cache_and_speculation_stay_on_the_device(feature):
    from handlers.generation.drafting import LookupDrafter
    from handlers.generation.engine import Engine
    from handlers.generation.prefix_cache import PrefixCache
    from tests.unit.test_generation_further import random_gru_drafter

    def engine_with(lm, device=None):
        base = random_engine(1)
        extra = {"prefix_cache": PrefixCache(1 << 22, block=4)} if feature == "prefix_cache" else \
            {"drafter": LookupDrafter() if feature == "lookup" else random_gru_drafter(2)}
        return Engine(lm, base.decode, base.eos_id, base.max_positions, device=device, **extra)

    shared = list(range(1, 21))
    requests = [(f"r{i}", ids_request(shared + [30 + i, 1, 2, 3, 1, 2, 3], 10)) for i in range(2)]
    expected = [generate(engine_with(random_engine(1).lm), request) for request in requests]
    with virtual_cuda():
        lm = random_engine(1).lm.to("cuda")
        engine = engine_with(lm)
        assert engine.device.type == "cuda"
        assert [generate(engine, request) for request in requests] == expected


@pytest.mark.parametrize("kind", ["gru", "causal_lm"])
def test_a_draft_model_drafts_on_the_targets_device(kind):
    """The drafter runs where the target model does: its weights, state and ids on the device (an
    eager draft module here, so the audit sees inside it), with the CPU's drafts."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from handlers.generation.drafting import CausalLMDrafter, RecurrentDrafter
    from handlers.generation.engine import Engine
    from models.tinylm.draft import RecurrentDraft

    def drafter():
        torch.manual_seed(4)
        if kind == "gru":
            return RecurrentDrafter(RecurrentDraft(211, embed=16, hidden=24).eval())
        return CausalLMDrafter(GPT2LMHeadModel(GPT2Config(vocab_size=211, n_layer=1, n_head=2, n_embd=16,
                                                          n_positions=128)).eval())

    def drafts(engine):
        return [engine.drafter.draft("a", [5, 6, 7, 8, 9], 4), engine.drafter.draft("a", [5, 6, 7, 8, 9, 1, 2], 3)]

    base = random_engine(1)
    expected = drafts(Engine(base.lm, base.decode, base.eos_id, base.max_positions, drafter=drafter()))
    with virtual_cuda() as audit:
        lm = random_engine(1).lm.to("cuda")
        engine = Engine(lm, base.decode, base.eos_id, base.max_positions, drafter=drafter())
        model = engine.drafter.module if kind == "gru" else engine.drafter.lm
        assert audit.marked(next(model.parameters())), "the draft model is on the target's device"
        assert drafts(engine) == expected


def test_a_text_workers_warm_up_on_a_gpu_runs_every_padded_length(tiny_dirs, monkeypatch):
    """Each batch size at every padded length the handler forms (pad_bucket up to max_length), so a
    graph that compiles per shape does so in the warm-up; on the CPU one batch per size, as before."""
    from handlers.handler import Handler

    seen = []
    real = Handler._forward

    def recording(self, inputs):
        seen.append(tuple(inputs[0].shape))
        return real(self, inputs)

    monkeypatch.setattr(Handler, "_forward", recording)
    with virtual_cuda():
        handler, _ = make_handler(tiny_dirs["tiny_text"], "tiny_text", batch_size=4, gpu_id=0, runtime={"warmup": True})
    settings = handler.family.settings
    widths = range(settings.pad_bucket, settings.max_length + 1, settings.pad_bucket)
    assert set(seen) >= {(rows, width) for rows in handler.buckets for width in widths}, sorted(set(seen))
    seen.clear()
    handler, _ = make_handler(tiny_dirs["tiny_text"], "tiny_text", batch_size=4, runtime={"warmup": True})
    assert len(seen) <= 2 * len(handler.buckets), seen  # the example batch per size (a pass per length group)


def test_a_language_model_worker_on_a_gpu_id_warms_up_and_answers(tiny_dirs):
    """The step mode's handler, warm-up on (the async mode runs the same engine from its own thread,
    which the audit does not follow: the engine tests above cover it)."""
    from tests.unit.generation_helpers import run_continuous

    body = {"prompt": "The for statement", "max_new_tokens": 6, "temperature": 0}

    def answer(gpu_id):
        handler, context = make_handler(tiny_dirs["tiny_lm"], "tiny_lm", batch_size=2, gpu_id=gpu_id,
                                        runtime={"warmup": True})
        answers, _ = run_continuous(handler, context, {0: [("a", body)], 1: [("b", {**body, "seed": 5,
                                                                                   "temperature": 0.9})]})
        return handler, {rid: [a for a in chunks if a] for rid, chunks in answers.items()}

    _, expected = answer(None)
    with virtual_cuda() as audit:
        handler, answered = answer(0)
        assert audit.marked(next(handler.model.parameters())), "the model is on the device"
    assert answered == expected and all(answered.values())


def test_the_async_mode_generates_on_the_device(tiny_dirs):
    """TorchServe's asynchronous worker mode: each request a coroutine, the engine loop stepping on
    the worker's own thread (the audit's), warm-up included."""
    import asyncio

    from handlers.async_handler import AsyncHandler
    from serving.fake_context import FakeContext

    body = {"prompt": "The for statement", "max_new_tokens": 6, "temperature": 0}

    def answer(gpu_id):
        context = FakeContext(tiny_dirs["tiny_lm"], "tiny_lm", batch_size=1, gpu_id=gpu_id,
                              handler_overrides={"causal_lm": {"mode": "async"}, "runtime": {"warmup": True}})
        context.model_yaml_config.pop("continuousBatching", None)
        context.model_yaml_config["asyncCommunication"] = True
        handler = AsyncHandler()
        handler.initialize(context)
        context.request_ids, context.headers = {0: "a"}, {0: {"Content-Type": "application/json"}}

        async def ask():
            try:
                return (await handler.handle([{"body": json.dumps(body).encode()}], context))[0]
            finally:
                handler.generation.loop.stop()

        return handler, json.loads(asyncio.run(ask()))

    _, expected = answer(None)
    with virtual_cuda() as audit:
        handler, answered = answer(0)
        assert audit.marked(next(handler.model.parameters()))
    assert answered["text"] == expected["text"] and answered["generated_tokens"] == 6
