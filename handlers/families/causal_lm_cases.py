"""The causal LM's cases, made from its limits (settings.causal_lm): every request form answered
(short generations, so a whole corpus stays quick), and each way to get a field wrong refused with
the field it names."""

from __future__ import annotations

from typing import Any

from handlers.families.cases import JSON, Case, invalid, json_body, nested, valid

PROMPT = "The for statement is used to"


def _ask(**fields: Any) -> bytes:
    return json_body({"prompt": PROMPT, "max_new_tokens": 2, **fields})


def cases(settings: Any) -> list[Case]:
    """`settings`: the family's CausalLMSettings (read: max_new_tokens, max_body_bytes)."""
    most = settings.max_new_tokens
    return [
        valid("a prompt", _ask(), JSON),
        valid("no content type (JSON)", _ask(), None),
        valid("streamed", _ask(stream=True), JSON),
        valid("sampled with a seed", _ask(temperature=0.8, top_k=20, top_p=0.9, seed=7), JSON),
        valid("a stop string", _ask(stop=["\n\n"]), JSON),
        valid("stop as one string", _ask(stop="."), JSON),
        valid("ignore_eos", _ask(ignore_eos=True), JSON),
        valid("unicode prompt", json_body({"prompt": "caf\u00e9 \U0001f600 \u4eca\u5929", "max_new_tokens": 1}), JSON),
        invalid("empty body", b"", JSON, 400, "malformed JSON"),
        invalid("malformed JSON", b'{"prompt": "x', JSON, 400, "malformed JSON"),
        invalid("JSON list, not an object", json_body([PROMPT]), JSON, 400, "JSON object"),
        invalid("no prompt", json_body({"max_new_tokens": 2}), JSON, 400, "prompt"),
        invalid("empty prompt", json_body({"prompt": ""}), JSON, 400, "prompt"),
        invalid("prompt not a string", json_body({"prompt": ["a", "b"]}), JSON, 400, "prompt"),
        invalid("unknown field", _ask(colour="red"), JSON, 400, "colour"),
        invalid("max_new_tokens zero", _ask(max_new_tokens=0), JSON, 400, "max_new_tokens"),
        invalid("max_new_tokens over the limit", _ask(max_new_tokens=most + 1), JSON, 400, "max_new_tokens"),
        invalid("max_new_tokens a string", _ask(max_new_tokens="4"), JSON, 400, "max_new_tokens"),
        invalid("negative temperature", _ask(temperature=-1), JSON, 400, "temperature"),
        invalid("top_p zero", _ask(top_p=0), JSON, 400, "top_p"),
        invalid("negative seed", _ask(seed=-1), JSON, 400, "seed"),
        invalid("stream not a boolean", _ask(stream="yes"), JSON, 400, "stream"),
        invalid("stop not strings", _ask(stop=[1, 2]), JSON, 400, "stop"),
        invalid("body over max_body_bytes", json_body({"prompt": "x" * (settings.max_body_bytes + 1)}), JSON, 413,
                ""),
        invalid("XML", b"<prompt/>", "application/xml", 415, "not supported"),
        invalid("prompt nested 100 levels deep", json_body({"prompt": nested(PROMPT, 100)}), JSON, 400, "nested"),
        invalid("JSON over max_body_bytes beside a short prompt",
                json_body({"prompt": PROMPT, "pad": "x" * settings.max_body_bytes}), JSON, 413, "limit"),
    ]

