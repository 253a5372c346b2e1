"""Causal language models: a prompt in, generated text out (whole, or streamed token by token).

Any Hugging Face causal LM folder (config, safetensors weights, tokenizer.json); generation itself
(KV cache, continuous batching, streaming) is handlers/generation/. This class is what the rest of
the package sees of the family: decoding and checking one request, and a forward pass (the next
token's logits for a batch of prompts) for the build's smoke test, gate and speed figures. Its end
and start tokens and chat template come from the model's own files (causal_lm_tokens.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

import torch

from handlers.errors import ConfigError
from handlers.families import causal_lm_cases
from handlers.families.base import Family
from handlers.families.cases import Case
from handlers.families.causal_lm_tokens import MODEL_FILES, read_special_tokens
from handlers.generation.params import GenerationRequest, Limits, parse_request
from handlers.json_body import read_json


@dataclass(frozen=True)
class CausalLMSettings:
    """settings.causal_lm: tokenizer file, the request limits, generation options. The special tokens
    and the chat template are the model's own (causal_lm_tokens.py); set one here only to override."""

    tokenizer: str = "tokenizer.json"  # archive file in the tokenizers library's format
    max_prompt_tokens: int = 256
    max_new_tokens: int = 256  # the most a request may ask for
    default_max_new_tokens: int = 64  # what a request gets when it does not say
    eos_token: Optional[str] = None  # ends a sequence when generated; None: from the model's files
    eos_tokens: Optional[tuple[str, ...]] = None  # several, any of which ends a sequence (instead of eos_token)
    bos_token: Optional[str] = None  # the start token; None: from the model's files
    add_bos: Optional[bool] = None  # prepend bos_token to prompts; None: as the model's tokenizer files say
    chat_template: Optional[str] = None  # a Jinja2 file in the archive, or the template; None: the model's
    max_body_bytes: int = 64 * 1024
    speculation: Literal["off", "lookup", "draft"] = "off"  # who drafts the tokens verified (greedy only)
    draft_model: str = "draft.pt"  # speculation: draft -- a TorchScript file or a Hugging Face folder in the archive
    speculate_max_batch: int = 2  # speculate only while the batch holds at most this many sequences
    max_draft_tokens: int = 8
    prefix_cache_mib: float = 0  # per worker; 0: no prefix cache
    prefix_block_tokens: int = 32  # prefixes are cached and found at multiples of this many tokens
    max_running: int = 0  # the most non-high-priority sequences advancing together (more wait); 0: no limit
    # How TorchServe drives the engine: "async" (asyncCommunication: requests join a loop that steps at
    # the engine's speed, several workers allowed, OpenAI's routes) or "step" (continuousBatching: one
    # call per step; a client that hangs up is released at the next step).
    mode: Literal["async", "step"] = "async"

    def __post_init__(self):
        if self.max_prompt_tokens < 1 or self.max_new_tokens < 1:
            raise ConfigError("causal_lm.max_prompt_tokens and causal_lm.max_new_tokens must be >= 1")
        if not 1 <= self.default_max_new_tokens <= self.max_new_tokens:
            raise ConfigError(f"causal_lm.default_max_new_tokens: must be 1..max_new_tokens ({self.max_new_tokens}), "
                              f"got {self.default_max_new_tokens}")
        if self.max_body_bytes < 1:
            raise ConfigError(f"causal_lm.max_body_bytes: must be >= 1, got {self.max_body_bytes}")
        if self.speculate_max_batch < 1 or not 1 <= self.max_draft_tokens <= 32:
            raise ConfigError("causal_lm.speculate_max_batch must be >= 1 and causal_lm.max_draft_tokens 1..32")
        if self.eos_token is not None and self.eos_tokens is not None:
            raise ConfigError("causal_lm.eos_token and causal_lm.eos_tokens: set one (eos_tokens for several)")
        if self.eos_tokens is not None and not self.eos_tokens:
            raise ConfigError("causal_lm.eos_tokens: name at least one token, or remove it (null: the model's own)")
        for key in ("eos_token", "bos_token", "chat_template"):
            if getattr(self, key) == "":
                raise ConfigError(f"causal_lm.{key}: empty; remove it (null: the model's own)")
        if self.eos_tokens is not None and "" in self.eos_tokens:
            raise ConfigError("causal_lm.eos_tokens: an empty token name")
        if self.prefix_cache_mib < 0 or self.prefix_block_tokens < 1 or self.max_running < 0:
            raise ConfigError("causal_lm.prefix_cache_mib and causal_lm.max_running must be >= 0, "
                              "causal_lm.prefix_block_tokens >= 1")


class LastTokenLogits(torch.nn.Module):
    """The causal LM as a plain batch model: left-padded prompts -> the next token's logits."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        return self.lm(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False,
                       logits_to_keep=1).logits[:, -1, :]


class CausalLM(Family):
    name = "causal_lm"
    Settings = CausalLMSettings
    input_kind = "json"
    generates = True  # the handler serves it with handlers/generation (stateful, step by step)
    huggingface_class = "AutoModelForCausalLM"
    openai_endpoints = frozenset({"completions", "chat", "models", "model"})
    huggingface_files = MODEL_FILES  # its special tokens and chat template are read from them

    def __init__(self, settings: CausalLMSettings, model_dir: Path, channels_last: bool = False) -> None:
        super().__init__(settings, model_dir, channels_last)
        from tokenizers import Tokenizer

        path = Path(model_dir) / settings.tokenizer
        if not path.is_file():
            raise ConfigError(f"causal_lm.tokenizer: {settings.tokenizer} is not in the archive")
        self.tokenizer = Tokenizer.from_file(str(path))
        tokens = read_special_tokens(settings, path.parent, Path(model_dir), self.tokenizer)
        self.eos_ids: tuple[int, ...] = tokens.eos_ids  # any of them ends a sequence
        self.eos_id = tokens.eos_ids[0]  # pads batches
        self.eos_token: str = tokens.eos_token  # text of the end and start tokens, for a chat template
        self.bos_token: Optional[str] = tokens.bos_token
        self.bos_id: Optional[int] = tokens.bos_id
        self.add_bos: bool = tokens.add_bos
        self.chat_template: Optional[str] = tokens.chat_template  # Jinja2 source, or None
        self.limits = Limits(settings.max_prompt_tokens, settings.max_new_tokens, settings.default_max_new_tokens,
                             max_prompt_chars=settings.max_body_bytes)

    @classmethod
    def archive_keys(cls, settings: CausalLMSettings) -> dict:
        """Async: TorchServe forwards each request as it comes; step: it calls the handler once per step."""
        return {"asyncCommunication": True} if settings.mode == "async" else {"continuousBatching": True}

    @classmethod
    def handler_entry(cls, settings: CausalLMSettings) -> str:
        return "handlers/async_handler.py" if settings.mode == "async" else super().handler_entry(settings)

    def encode(self, text: str) -> list[int]:
        """The prompt's tokens, after the start token when the model wants one. The tokenizer adds no
        special tokens of its own; a prompt that starts with the start token's text (a rendered chat
        template, say) keeps just that one."""
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if self.add_bos and ids[:1] != [self.bos_id]:
            ids = [self.bos_id, *ids]
        return ids

    def decode_text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def check_model(self, lm: torch.nn.Module) -> int:
        """The model's context length, which must hold the longest prompt plus the most new tokens."""
        # Every transformers config answers max_position_embeddings (an alias where it names it otherwise).
        positions = int(getattr(lm.config, "max_position_embeddings", 0) or 0)
        needed = self.settings.max_prompt_tokens + self.settings.max_new_tokens
        if positions and needed > positions:
            raise ConfigError(f"causal_lm: max_prompt_tokens + max_new_tokens = {needed} exceeds the model's "
                              f"{positions} positions: lower one of them")
        return positions or needed

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return LastTokenLogits(model)

    def decode(self, body: Any, content_type: str) -> GenerationRequest:
        body = read_json(body, content_type, self.settings.max_body_bytes, "send application/json")
        return parse_request(body, self.encode, self.limits)

    def collate(self, items: Sequence[GenerationRequest]) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompts left-padded to the longest: each row's last column is its last prompt token."""
        width = max(len(item.prompt_ids) for item in items)
        ids = torch.full((len(items), width), self.eos_id, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for row, item in enumerate(items):
            ids[row, width - len(item.prompt_ids):] = torch.tensor(item.prompt_ids)
            mask[row, width - len(item.prompt_ids):] = 1
        return ids, mask

    def postprocess(self, outputs: torch.Tensor, inputs) -> list[dict]:
        tokens = outputs.argmax(dim=-1).tolist()
        return [{"next_token": token, "text": self.decode_text([token])} for token in tokens]

    def example_batch(self, size: int):
        prompts = ["The for statement", "A class definition defines a class object, and its suite is executed."]
        return self.collate([self.decode({"prompt": prompts[i % 2]}, "") for i in range(size)])

    def example_request(self, new_tokens: int = 4) -> GenerationRequest:
        """A short greedy generation, for warm-up."""
        return self.decode({"prompt": "The for statement", "max_new_tokens": min(new_tokens, self.limits.max_new_tokens)},
                           "")

    def gate_kind(self) -> str:
        return "classification"  # the next token: top-1 agreement

    @classmethod
    def bad_inputs(cls, settings: CausalLMSettings) -> list[Case]:
        return cls.stamped(causal_lm_cases.cases(settings))

    @classmethod
    def answer_problem(cls, settings: CausalLMSettings, answer) -> Optional[str]:
        """A whole answer: its text, why it finished and its token counts."""
        if not isinstance(answer, dict) or not isinstance(answer.get("text"), str) or "finish_reason" not in answer:
            return f'expected {{"text": ..., "finish_reason": ...}}, got {str(answer)[:80]}'
        return None
