"""A generative family's serving put together: its engine over the loaded LM, and the loop for the
archive's mode (a whole batch per call, a step per call, or the async engine loop), each facing the
engine adapter through a Door and the family through its TextModel side (door.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from handlers.device import kv_cache_budget
from handlers.generation.async_serving import AsyncGenerationService
from handlers.generation.door import Door, RecordDoor, TextModel
from handlers.generation.drafting import load_drafter
from handlers.generation.engine import Engine
from handlers.generation.metrics import loop_emitter
from handlers.generation.prefix_cache import PrefixCache
from handlers.generation.serving import GenerationService

PLAIN, STEP, ASYNC = "plain", "step", "async"  # a whole batch per call, a step per call, the engine loop


@dataclass(frozen=True)
class LoadedLM:
    """What the loops need of the loaded model."""

    lm: Any  # the Hugging Face causal LM
    text: TextModel  # the family: tokens, text, ends, chat template, limits
    settings: Any  # the family's settings (handlers/families/causal_lm.py CausalLMSettings)
    model_name: str
    model_dir: Path
    device: Any = None  # torch.device; None: where the LM's weights are
    autocast_dtype: Any = None


def build(loaded: LoadedLM, door: Union[Door, RecordDoor], mode: str, metrics: Any = None):
    """The service for `mode` (ASYNC takes a RecordDoor, the others a Door); `metrics`: the engine's
    MetricsSink the async loop reports into between requests (None: it reports nothing)."""
    settings = loaded.settings
    cache = PrefixCache(int(settings.prefix_cache_mib * 2**20), settings.prefix_block_tokens) \
        if settings.prefix_cache_mib > 0 else None
    engine = Engine(loaded.lm, loaded.text.decode_text, loaded.text.eos_ids, loaded.text.check_model(loaded.lm),
                    loaded.autocast_dtype, drafter=load_drafter(settings.speculation, loaded.model_dir,
                                                                settings.draft_model),
                    speculate_max_batch=settings.speculate_max_batch, max_draft_tokens=settings.max_draft_tokens,
                    prefix_cache=cache, device=loaded.device, kv_budget_bytes=kv_cache_budget(loaded.device))
    warm = loaded.text.example_request()
    if mode == ASYNC:
        return AsyncGenerationService(engine, loaded.model_name, door, family=loaded.text,
                                      max_running=settings.max_running, emit=loop_emitter(metrics, loaded.model_name),
                                      warm_request=warm)
    return GenerationService(engine, loaded.model_name, mode == STEP, door, warm_request=warm,
                             max_running=settings.max_running)


def generation_service(handler, model_dir: Path, continuous: bool, asynchronous: bool = False):
    """The service for the handler: its loaded model, and the Door its engine adapter opens
    (`handler.engine`, handlers/engines/)."""
    engine = handler.engine

    def priority(context, idx: int):
        (request,) = engine.requests([None], context, None, [idx])
        return request.header("x-priority")

    loaded = LoadedLM(handler.model.lm, handler.family, handler.family.settings, handler.model_name, model_dir,
                      handler.device, handler.autocast_dtype)
    if asynchronous:
        door = RecordDoor(decode=handler.decode_request, refuse=handler.refusal, send_step=engine.send_step)
    else:
        door = Door(decode=handler.decode_each, fail=handler.reject, stream=engine.send_intermediate,
                    priority=priority, metrics=engine.metrics)
    mode = ASYNC if asynchronous else STEP if continuous else PLAIN
    return build(loaded, door, mode, engine.metrics(handler.metrics_context))
