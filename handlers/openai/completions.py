"""POST v1/completions and v1/chat/completions bodies -> a checked `Call` for the engine.

The generation fields go through the same checks and limits as /predictions
(generation/params.parse_request), under OpenAI's names: `max_tokens` (chat: or
`max_completion_tokens`) is max_new_tokens; `temperature`, `top_p`, `seed`, `stop` and `stream`
keep theirs; `top_k` and `ignore_eos` are our extensions (vLLM's too; `top_k: -1`, vLLM's "off",
is 0). Defaults are OpenAI's: temperature 1 and top_p 1 (sampling), so a client wanting greedy
output sends `temperature: 0`; max_tokens is the archive's default_max_new_tokens. fields.py lists
the fields accepted without effect and those refused (bodies.py checks a body against them).

A prompt over the archive's limits is a 400 with code "context_length_exceeded", as OpenAI answers.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

from handlers.errors import PayloadTooLarge
from handlers.generation.params import GenerationRequest, Limits, parse_request
from handlers.openai import chat_template
from handlers.openai.bodies import chat_schema, completion_schema, usage_options, validated
from handlers.openai.errors import OpenAIError, invalid_type, unsupported_value
from handlers.openai.fields import Neutral, same_json, served_model

DEFAULT_TEMPERATURE = 1.0  # OpenAI's
Encode = Callable[[str], Sequence[int]]

# OpenAI's roles -> the role the chat template sees: "developer" is OpenAI's newer name for "system".
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_NO_TOOLS = "tools and function calling are not supported"
# What an assistant message the client got from us, sent back as it is, also holds.
_MESSAGE_NEUTRAL = {
    "refusal": Neutral((), "refusals are not taken back in"),
    "tool_calls": Neutral(([],), _NO_TOOLS),
    "function_call": Neutral((), _NO_TOOLS),
    "audio": Neutral((), "text only"),
    "annotations": Neutral(([],), "annotations are not supported"),
}


@dataclass(frozen=True)
class Call:
    """One checked generation request: what the engine runs, and what its answer echoes."""

    request: GenerationRequest
    chat: bool  # v1/chat/completions (else v1/completions)
    model: str  # as the client named it
    id: str  # "cmpl-..." / "chatcmpl-...", the same in every chunk
    created: int  # Unix seconds, the same in every chunk
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the token counts
    continuous_usage: bool = False  # stream_options.continuous_usage_stats too: the counts in every chunk

    @property
    def stream(self) -> bool:
        return self.request.stream


def parse_completion(body: Any, encode: Encode, limits: Limits, model_name: str, aliases: Sequence[str] = (),
                     request_id: Optional[str] = None, created: Optional[int] = None) -> Call:
    """A v1/completions body. `encode`: the family's text -> token ids; `model_name` and `aliases`:
    the names `model` may give (none: `model_name`); `request_id`: makes the answer's id
    (default: a random one). Temperature defaults to 1: send `temperature: 0` for greedy output."""
    checked = validated(completion_schema(), body)
    model = served_model(body, (model_name, *aliases))
    usage, continuous = usage_options(checked)
    request = _generation(body, _prompt(body.get("prompt")), encode, limits, "max_tokens", "prompt")
    return Call(request, False, model, _id("cmpl-", request_id), _created(created), usage, continuous)


def parse_chat(body: Any, encode: Encode, limits: Limits, model_name: str, template: Optional[str],
               bos_token: str = "", eos_token: str = "", aliases: Sequence[str] = (),
               request_id: Optional[str] = None, created: Optional[int] = None) -> Call:
    """A v1/chat/completions body; `template`: the tokenizer's Jinja2 chat template (None: the
    plain one, chat_template.plain). Temperature defaults to 1: send `temperature: 0` for greedy output."""
    checked = validated(chat_schema(), body)
    model = served_model(body, (model_name, *aliases))
    usage, continuous = usage_options(checked)
    messages = _messages(body.get("messages"))
    # Bounded before rendering, so an oversized conversation costs no template work.
    chars = sum(len(m["content"]) for m in messages)
    if chars > limits.max_prompt_chars:
        raise OpenAIError(f'"messages" hold {chars} characters, over this model\'s limit of {limits.max_prompt_chars}',
                          param="messages", code="context_length_exceeded")
    prompt = chat_template.render(messages, template, bos_token, eos_token)
    request = _generation(body, prompt, encode, limits, _max_tokens_field(body), "messages")
    return Call(request, True, model, _id("chatcmpl-", request_id), _created(created), usage, continuous)


def _id(prefix: str, request_id: Optional[str]) -> str:
    return prefix + (request_id or uuid.uuid4().hex)


def _created(created: Optional[int]) -> int:
    return int(time.time()) if created is None else int(created)


def _prompt(prompt: Any) -> str:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return prompt
    if prompt is None:
        raise OpenAIError("Missing required parameter: 'prompt'", param="prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        raise unsupported_value("prompt", f"a batch of {len(prompt)} prompts: send one prompt per request")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (int, list)) and not isinstance(p, bool)
                                                   for p in prompt):
        raise unsupported_value("prompt", "token-id prompts are not supported: send the prompt as text")
    raise invalid_type("prompt", "a string or an array of one string", prompt)


def _max_tokens_field(body: Mapping[str, Any]) -> str:
    """The field that sets the chat's max_new_tokens: max_completion_tokens (OpenAI's current name) or max_tokens."""
    newer, older = body.get("max_completion_tokens"), body.get("max_tokens")
    if newer is not None and older is not None and not same_json(newer, older):
        raise OpenAIError("'max_tokens' and 'max_completion_tokens' disagree: send one of them", param="max_tokens")
    return "max_completion_tokens" if newer is not None else "max_tokens"


def _generation(body: Mapping[str, Any], prompt: str, encode: Encode, limits: Limits, max_field: str,
                prompt_field: str) -> GenerationRequest:
    """parse_request on /predictions' body for these fields; its errors name OpenAI's fields."""
    native = {"prompt": prompt, "temperature": DEFAULT_TEMPERATURE}
    for ours, theirs in (("max_new_tokens", max_field), ("temperature", "temperature"), ("top_p", "top_p"),
                         ("seed", "seed"), ("stop", "stop"), ("stream", "stream"), ("top_k", "top_k"),
                         ("ignore_eos", "ignore_eos")):
        if body.get(theirs) is not None:  # null: OpenAI's default
            native[ours] = body[theirs]
    if type(native.get("top_k")) is int and native["top_k"] == -1:
        native["top_k"] = 0
    try:
        return parse_request(native, encode, limits, names={"prompt": prompt_field, "max_new_tokens": max_field})
    except PayloadTooLarge as err:
        raise OpenAIError(err.message, param=err.param, code="context_length_exceeded") from None


def _messages(value: Any) -> list[dict]:
    """OpenAI's messages -> {"role", "content": str, "name"?} for the chat template."""
    if not isinstance(value, list) or not value:
        if value is None:
            raise OpenAIError("Missing required parameter: 'messages'", param="messages")
        raise invalid_type("messages", "a non-empty array of messages", value)
    out = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise invalid_type(where, "an object", message)
        role = message.get("role")
        if role in ("tool", "function"):
            raise unsupported_value(f"{where}.role", _NO_TOOLS)
        if not isinstance(role, str) or role not in ROLES:
            raise OpenAIError(f"Invalid value for '{where}.role': expected one of {', '.join(ROLES)}, "
                              f"got {role!r}"[:300], param=f"{where}.role")
        for key, field in message.items():
            if key in ("role", "content", "name"):
                continue
            neutral = _MESSAGE_NEUTRAL.get(key)
            if neutral is None:
                raise OpenAIError(f"Unrecognized request argument supplied: {where}.{key}", param=f"{where}.{key}")
            if field is not None and not any(same_json(field, v) for v in neutral.values):
                raise unsupported_value(f"{where}.{key}", neutral.why)
        entry = {"role": ROLES[role], "content": _content(message.get("content"), f"{where}.content")}
        name = message.get("name")
        if name is not None:
            if not isinstance(name, str):
                raise invalid_type(f"{where}.name", "a string", name)
            entry["name"] = name
        out.append(entry)
    return out


def _content(content: Any, where: str) -> str:
    """A string, or text parts joined by newlines (as vLLM joins them)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise invalid_type(where, "a string or a non-empty array of text parts", content)
    texts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(part, Mapping):
            raise invalid_type(at, "an object", part)
        kind = part.get("type")
        if kind != "text":
            if isinstance(kind, str) and kind in ("image_url", "input_audio", "file", "refusal"):
                raise unsupported_value(f"{at}.type", "text only: parts must be {\"type\": \"text\", ...}")
            raise OpenAIError(f"Invalid value for '{at}.type': expected \"text\", got {kind!r}"[:300],
                              param=f"{at}.type")
        extra = sorted(set(part) - {"type", "text"})
        if extra:
            raise OpenAIError(f"Unrecognized request argument supplied: {at}.{extra[0]}", param=f"{at}.{extra[0]}")
        if not isinstance(part.get("text"), str):
            raise invalid_type(f"{at}.text", "a string", part.get("text"))
        texts.append(part["text"])
    return "\n".join(texts)
