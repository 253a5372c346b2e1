"""A generative family's engine and service over a loaded handler's model (imported only for them):
step by step (continuous batching), a whole batch per call, or the engine loop (async mode)."""

from __future__ import annotations

from pathlib import Path

from handlers.generation.async_serving import AsyncGenerationService
from handlers.generation.drafting import load_drafter
from handlers.generation.engine import Engine
from handlers.generation.metrics import loop_emitter
from handlers.generation.prefix_cache import PrefixCache
from handlers.generation.serving import GenerationService
from handlers.kserve import header
from handlers.request_parts import request_headers


def priority_of(context, idx: int):
    return header(request_headers(context, idx), "x-priority")


def generation_service(handler, model_dir: Path, continuous: bool, asynchronous: bool = False):
    lm, settings = handler.model.lm, handler.family.settings
    cache = PrefixCache(int(settings.prefix_cache_mib * 2**20), settings.prefix_block_tokens) \
        if settings.prefix_cache_mib > 0 else None
    engine = Engine(lm, handler.family.decode_text, handler.family.eos_ids, handler.family.check_model(lm),
                    handler.autocast_dtype, drafter=load_drafter(settings.speculation, model_dir,
                                                                 settings.draft_model),
                    speculate_max_batch=settings.speculate_max_batch, max_draft_tokens=settings.max_draft_tokens,
                    prefix_cache=cache, device=handler.device)
    if asynchronous:
        return AsyncGenerationService(engine, handler.model_name, handler.decode_each, handler.reject,
                                      family=handler.family, max_running=settings.max_running,
                                      priority_of=priority_of,
                                      emit=loop_emitter(handler.metrics_context, handler.model_name),
                                      warm_request=handler.family.example_request())
    return GenerationService(engine, handler.model_name, continuous, handler.decode_each, handler.reject,
                             warm_request=handler.family.example_request(), max_running=settings.max_running,
                             priority_of=priority_of)
