"""Who drafts the tokens speculative decoding verifies (engine.py): prompt lookup (no model), a
recurrent TorchScript draft model (`draft.pt`, like the shipped example's), or a Hugging Face
causal LM with the same tokenizer (the user's). A drafter keeps what it has read of each
sequence, so each round it reads only the tokens the target model added since, and when the
target model rejected part of a draft it steps back to the last accepted token. A draft model runs
where the target model does (the engine moves it there): on a GPU, a CPU draft would cost a host
round trip and the CPU's speed for every drafted token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional, Protocol

import torch

from handlers.generation.speculation import lookup_draft


class Drafter(Protocol):
    def draft(self, key: str, tokens: Sequence[int], count: int) -> list[int]:
        """Up to `count` guesses of what follows `tokens` (a sequence's prompt and generated tokens)."""

    def forget(self, key: str) -> None:
        """The sequence has ended: drop what is kept for it."""

    def to(self, device: torch.device) -> Drafter:
        """The drafter, running on `device` (where the target model is)."""


class LookupDrafter:
    def draft(self, key: str, tokens: Sequence[int], count: int) -> list[int]:
        return lookup_draft(tokens, count)

    def to(self, device: torch.device) -> LookupDrafter:
        return self

    def forget(self, key: str) -> None:
        pass


@dataclass
class _Read:
    """What a draft model has read of one sequence: `anchor` tokens of the sequence, then its own
    guesses of the last round, each with the state after it (to step back to)."""

    anchor: int
    state: object
    guesses: list[tuple[int, object]] = field(default_factory=list)


class ModelDrafter:
    """Greedy drafts from a small model. `step(ids (1, n), state) -> (last logits (vocab,), state)`;
    `start()` -> the state before any token. Subclasses give these two."""

    def __init__(self) -> None:
        self.read: dict[str, _Read] = {}
        self.device = torch.device("cpu")  # where the model is loaded; `to` moves it

    def to(self, device: torch.device) -> ModelDrafter:
        """Moves the model (and drops what was read: its states were on the old device)."""
        self.device = torch.device(device)
        self._move(self.device)
        self.read.clear()
        return self

    def _move(self, device: torch.device) -> None:
        raise NotImplementedError

    def ids(self, ids: list[int]) -> torch.Tensor:
        return torch.tensor([ids], dtype=torch.long, device=self.device)

    def start(self):
        raise NotImplementedError

    def step(self, ids: list[int], state, length: int):
        raise NotImplementedError

    def draft(self, key: str, tokens: Sequence[int], count: int) -> list[int]:
        read = self.read.get(key)
        if read is None:
            read = self.read[key] = _Read(0, self.start())
        kept = 0  # the last round's guesses the sequence went on with
        while kept < len(read.guesses) and read.anchor + kept < len(tokens) \
                and tokens[read.anchor + kept] == read.guesses[kept][0]:
            kept += 1
        state = read.guesses[kept - 1][1] if kept else read.state
        start = read.anchor + kept
        with torch.inference_mode():
            logits, state = self.step(list(tokens[start:]), state, start)
            read.anchor, read.state, read.guesses = len(tokens), state, []
            guesses = [int(logits.argmax())]
            while len(guesses) < count:
                logits, state = self.step(guesses[-1:], state, len(tokens) + len(guesses) - 1)
                read.guesses.append((guesses[-1], state))
                guesses.append(int(logits.argmax()))
        return guesses

    def forget(self, key: str) -> None:
        self.read.pop(key, None)


class RecurrentDrafter(ModelDrafter):
    """A TorchScript module with `forward(ids, state) -> (logits, state)` and `initial_state(rows)`."""

    def __init__(self, module: torch.jit.ScriptModule) -> None:
        super().__init__()
        self.module = module

    def _move(self, device: torch.device) -> None:
        self.module.to(device)

    def start(self):
        return self.module.initial_state(1).to(self.device)  # made on the host by the module

    def step(self, ids: list[int], state, length: int):
        logits, state = self.module(self.ids(ids), state)
        return logits[0, -1], state


class CausalLMDrafter(ModelDrafter):
    """Any Hugging Face causal LM sharing the target's tokenizer; its state is its KV cache, whose
    length says how much it has read (a step back crops it)."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def _move(self, device: torch.device) -> None:
        self.lm.to(device)

    def start(self):
        return None

    def step(self, ids: list[int], state, length: int):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.lm.config)
        if state is not None:  # (layers, length): copy on write, so an older state stays valid
            cache = DynamicCache(ddp_cache_data=[(k[:, :, :length], v[:, :, :length]) for k, v in state],
                                 config=self.lm.config)
        out = self.lm(input_ids=self.ids(ids), past_key_values=cache, use_cache=True,
                      logits_to_keep=1)
        return out.logits[0, -1].float(), [(layer.keys, layer.values) for layer in out.past_key_values.layers]


def load_drafter(kind: str, model_dir, draft_model: str) -> Optional[Drafter]:
    """settings.causal_lm.speculation: off | lookup | draft (draft_model: a TorchScript file or a
    Hugging Face folder in the archive). Loaded on the host: the engine moves it to the LM's device."""
    from pathlib import Path

    from handlers.errors import ConfigError

    if kind == "off":
        return None
    if kind == "lookup":
        return LookupDrafter()
    path = Path(model_dir) / draft_model
    if path.is_file():
        # fp32 whatever the file stores (the shipped draft is fp16 on disk).
        return RecurrentDrafter(torch.jit.load(str(path), map_location="cpu").float().eval())
    if (path / "config.json").is_file():
        from transformers import AutoModelForCausalLM

        return CausalLMDrafter(AutoModelForCausalLM.from_pretrained(str(path)).eval())
    raise ConfigError(f"causal_lm.draft_model: {draft_model!r} is neither a TorchScript file nor a Hugging Face "
                      "folder in the archive (set it, or speculation: lookup)")
