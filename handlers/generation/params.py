"""One generation request, read from its JSON body and checked against the archive's limits.

    {"prompt": "...", "max_new_tokens": 64, "temperature": 0, "top_k": 0, "top_p": 1.0,
     "seed": 7, "stop": ["\\n\\n"], "stream": false, "ignore_eos": false}

`ignore_eos` generates max_new_tokens whatever the model says (benchmarks want fixed lengths).

Every problem is a BadInput naming the field (its `param` too); an unknown field is refused, never
ignored. Another protocol reusing these checks (handlers/openai/) passes `names`: the names its
clients know the fields by, used in messages and `param`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Optional

from handlers.errors import BadInput, PayloadTooLarge

FIELDS = ("prompt", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop", "stream", "ignore_eos")
MAX_TEMPERATURE = 10.0
MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 64
_SAME_NAMES: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class Limits:
    """What the archive allows (settings.causal_lm)."""

    max_prompt_tokens: int
    max_new_tokens: int
    default_max_new_tokens: int
    max_prompt_chars: int = 64 * 1024  # checked before tokenising (a JSON body arrives already decoded)


@dataclass(frozen=True)
class GenerationRequest:
    prompt: str
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: no top-k cut
    top_p: float = 1.0
    seed: Optional[int] = None  # sampling only; None: a fresh random seed
    stop: tuple[str, ...] = ()
    stream: bool = False
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _integer(body: Mapping[str, Any], name: str, default: int, low: int, high: int, label: str) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadInput(f'"{label}" must be an integer from {low} to {high}, got {value!r}', param=label)
    return value


def _number(body: Mapping[str, Any], name: str, default: float, low: float, high: float, low_open: bool,
            label: str) -> float:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadInput(f'"{label}" must be a number, got {value!r}', param=label)
    value = float(value)
    if not (low < value if low_open else low <= value) or not value <= high:
        bound = f"above {low}" if low_open else f"from {low}"
        raise BadInput(f'"{label}" must be {bound} to {high}, got {value!r}', param=label)
    return value


def parse_request(body: Any, encode, limits: Limits, names: Mapping[str, str] = _SAME_NAMES) -> GenerationRequest:
    """`body`: the decoded JSON; `encode`: text -> token ids (the archive's tokenizer); `names`: field
    -> the name errors call it by (a field not in it: its own name)."""
    def label(field: str) -> str:
        return names.get(field, field)

    if not isinstance(body, Mapping):
        raise BadInput(f'expected a JSON object {{"prompt": "..."}}, got JSON {type(body).__name__}')
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise BadInput(f'unknown field "{unknown[0]}" (fields: {", ".join(FIELDS)})', param=unknown[0])
    prompt, name = body.get("prompt"), label("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise BadInput(f'"{name}" must be a non-empty string, got {prompt!r}'[:200], param=name)
    if len(prompt) > limits.max_prompt_chars:
        raise PayloadTooLarge(f'"{name}" is {len(prompt)} characters, over this model\'s limit of '
                              f'{limits.max_prompt_chars}', param=name)
    ids = tuple(encode(prompt))
    if not ids:
        raise BadInput(f'"{name}" encodes to no tokens', param=name)
    if len(ids) > limits.max_prompt_tokens:
        raise PayloadTooLarge(f'"{name}" is {len(ids)} tokens, over this model\'s limit of {limits.max_prompt_tokens}',
                              param=name)
    stop, name = body.get("stop", []), label("stop")
    if isinstance(stop, str):
        stop = [stop]
    if (not isinstance(stop, list) or len(stop) > MAX_STOP_STRINGS
            or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stop)):
        raise BadInput(f'"{name}" must be a string or a list of at most {MAX_STOP_STRINGS} non-empty strings of at '
                       f'most {MAX_STOP_CHARS} characters', param=name)
    stream, ignore_eos = body.get("stream", False), body.get("ignore_eos", False)
    for name, flag in ((label("stream"), stream), (label("ignore_eos"), ignore_eos)):
        if not isinstance(flag, bool):
            raise BadInput(f'"{name}" must be true or false, got {flag!r}', param=name)
    seed = body.get("seed")
    if seed is not None:
        seed = _integer(body, "seed", 0, 0, 2**63 - 1, label("seed"))
    return GenerationRequest(
        prompt=prompt,
        prompt_ids=ids,
        max_new_tokens=_integer(body, "max_new_tokens", limits.default_max_new_tokens, 1, limits.max_new_tokens,
                                label("max_new_tokens")),
        temperature=_number(body, "temperature", 0.0, 0.0, MAX_TEMPERATURE, False, label("temperature")),
        top_k=_integer(body, "top_k", 0, 0, 1_000_000, label("top_k")),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, True, label("top_p")),
        seed=seed,
        stop=tuple(stop),
        stream=stream,
        ignore_eos=ignore_eos,
    )
