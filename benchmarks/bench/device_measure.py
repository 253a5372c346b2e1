"""The device check's measurements (benchmarks/bench/device_check.py): answers compared by the
family's gate kind, whole-handler and bare-forward items/s, CUDA graphs on and off, a causal LM's
tokens/s and greedy agreement. Timings on CUDA end with a synchronisation, so they count the
kernels, not only their launch."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

# Agreement targets: fp32 on two devices differs by summation order only; a reduced precision more.
COSINE = {"fp32": 0.999}
REDUCED_COSINE = 0.99


def answers_of(handler, context, requests) -> tuple[list[Any], list[str]]:
    """The handler's answers to the examples, each sent with its content type, as one batch; and
    the refusals among them ("example 2: 400 ..."), which no agreement can pass."""
    import json

    context.headers = {i: {"Content-Type": kind} for i, (_, kind) in enumerate(requests)}
    context.statuses = {}
    replies = handler.handle([{"body": body} for body, _ in requests], context)
    refused = [f"example {i}: {status} {message}"[:300] for i, (status, message) in sorted(context.statuses.items())
               if status >= 300]
    return [json.loads(r) for r in replies], refused


def ran_as(handler) -> dict[str, Any]:
    """What a handler really runs, for its rows: the archive's variant and graph, the precision (a
    serialised graph's is the one traced or exported into it, whatever was asked), TF32 on or off."""
    from handlers.settings import SERIALISED_GRAPHS

    rt = handler.settings.runtime
    if rt.graph in SERIALISED_GRAPHS:
        precision = rt.precision
    else:
        precision = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[handler.autocast_dtype]
    tf32 = handler.device.type == "cuda" and bool(torch.backends.cuda.matmul.allow_tf32)
    return {"variant": handler.settings.variant or rt.graph, "graph": rt.graph, "precision": precision, "tf32": tf32}


def agreement(family, reference: Sequence[Any], answers: Sequence[Any], precision: str,
              refused: Sequence[str] = ()) -> dict[str, Any]:
    """How these answers agree with the reference (the CPU's fp32), by the family's gate kind. A
    refused example fails it, whatever the answers say."""
    kind = family.gate_kind()
    if refused:
        return {"kind": kind, "worst": None, "target": None, "passed": False, "problem": "; ".join(refused)}
    if kind == "embedding":
        cosines = [_cosine(a["embedding"], b["embedding"]) for a, b in zip(reference, answers)]
        floor = COSINE.get(precision, REDUCED_COSINE)
        return {"kind": "cosine", "worst": min(cosines), "target": floor, "passed": min(cosines) >= floor}
    if kind == "classification":
        same = [_top1(a) == _top1(b) for a, b in zip(reference, answers)]
        return {"kind": "top-1", "worst": sum(same) / len(same), "target": 1.0, "passed": all(same)}
    problems = [family.disagreement(family.settings, a, b) for a, b in zip(reference, answers)]
    found = [p for p in problems if p]
    # Raw numbers at a reduced precision differ beyond an fp32 tolerance by design: reported, not judged
    # (a model served so has its own gate tolerance in the catalogue).
    return {"kind": "tolerance", "worst": len(found), "target": 0, "passed": not found if precision == "fp32" else None,
            "problem": found[0] if found else None}


def _top1(answer: Any) -> Any:
    if isinstance(answer, dict) and "class" in answer:
        return answer["class"]
    return next(iter(answer)) if isinstance(answer, dict) else answer


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def handler_items_per_s(handler, context, requests, batch_size: int, seconds: float) -> float:
    from benchmarks.bench.inprocess import measure

    return measure(handler, context, requests, batch_size, seconds).items_per_s


def collated(handler, requests, batch_size: int) -> tuple[torch.Tensor, ...]:
    """The batch the handler would form from the examples, decoded and collated once."""
    items = [handler.family.decode(requests[i % len(requests)][0], requests[i % len(requests)][1])
             for i in range(batch_size)]
    return handler.family.model_inputs(handler.family.collate(items))


def bare_items_per_s(handler, requests, batch_size: int, seconds: float) -> float:
    """The forward alone on a batch already on the device, in the model's layout: the limit."""
    from handlers import runtime

    rt = handler.settings.runtime
    inputs = tuple(runtime.to_device(runtime.memory_format(t, rt.channels_last), handler.device)
                   for t in collated(handler, requests, batch_size))
    with torch.inference_mode(), runtime.autocast(handler.device, handler.autocast_dtype):
        for _ in range(2):
            handler.model(*inputs)
        _sync(handler.device)
        count, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds or count < 3:
            handler.model(*inputs)
            count += 1
        _sync(handler.device)
    return count * batch_size / (time.perf_counter() - started)


def graph_speedup(plain, graphed, requests, seconds: float) -> dict[str, float]:
    """The bare forward at batch 1 without and with CUDA graphs (the handler pads nothing at 1)."""
    off = bare_items_per_s(plain, requests, 1, seconds)
    on = bare_items_per_s(graphed, requests, 1, seconds)
    return {"off_items_per_s": off, "on_items_per_s": on, "speedup": on / off}


def lm_check(plan, model: str, folder, budget, handler_for: Callable, progress) -> dict[str, Any]:
    """A causal LM: greedy tokens on each device against the CPU's fp32, and the engine's tokens/s at
    plan.streams concurrent sequences of plan.lm_tokens tokens. A device that fails costs its own row."""
    from benchmarks.load.inputs import worker_requests

    requests = worker_requests(model, plan.catalogue)
    result: dict[str, Any] = {"model": model, "family": "causal_lm", "variant": "eager", "rows": [], "errors": [],
                              "agreement": [], "graphs": None, "peak_gpu_mib": None, "random_weights": False}
    reference = None
    for device in plan.devices:
        if not budget.allows(f"{model} on {device}", 30.0):
            continue
        try:
            handler, _ = handler_for(folder, model, device, "fp32", plan.streams,
                                     sections={"causal_lm": {"mode": "step"}})
            label = ran_as(handler)
            result["variant"] = label["variant"]
            engine, family = handler.generation.engine, handler.family
            asked = [family.decode(body, kind) for body, kind in requests]
            greedy = [engine.generate([("g", request)])["g"].generated_ids
                      for request in (_greedy(family, r) for r in asked)]
            reference = reference or greedy
            same = sum(a == b for a, b in zip(reference, greedy))
            result["agreement"].append({"device": device, **label, "kind": "greedy tokens",
                                        "worst": same / len(greedy), "target": 1.0, "passed": same == len(greedy)})
            long = _greedy(family, asked[0], tokens=plan.lm_tokens)
            started = time.perf_counter()
            done = engine.generate([(f"s{i}", long) for i in range(plan.streams)])
            _sync(handler.device)
            tokens = sum(seq.generated for seq in done.values())
            result["rows"].append({"device": device, **label, "batch_size": plan.streams,
                                   "tokens_per_s": tokens / (time.perf_counter() - started)})
            progress(f"{model} {device}: {result['rows'][-1]['tokens_per_s']:.0f} tokens/s at {plan.streams} streams")
        except Exception as err:  # noqa: BLE001 - one failing device is reported, the check goes on
            result["errors"].append(f"{device}: {type(err).__name__}: {err}"[:500])
            progress(f"{model} FAILED on {device}: {type(err).__name__}: {err}")
    return result


def _greedy(family, request, tokens: int = 16):
    from dataclasses import replace

    return replace(request, temperature=0.0, max_new_tokens=tokens, ignore_eos=True, seed=None)
