"""Generation on one worker: sequences enter with a prefill, then advance together, one token per
decoding step, over one batched KV cache (kv_batch.py). Finished sequences leave at once and free
their rows. The same engine serves TorchServe (serving.py), the in-process benchmark and tests.

Works with any Hugging Face causal LM that takes `attention_mask`, `position_ids` and a
`DynamicCache` (GPT-2, Llama, Qwen, ...).

With a KV-cache budget (`kv_budget_bytes`), admission is where memory is refused: a sequence is
admitted only if the batch's cache, every sequence at its longest (prompt + max_new_tokens), stays
within the budget, so a running sequence never runs the cache out of memory; one that could not fit
even alone is refused when it is made (OutOfMemory, 507).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Optional

import torch

from handlers import runtime
from handlers.errors import OutOfMemory
from handlers.generation.drafting import Drafter
from handlers.generation.kv_batch import KVBatch
from handlers.generation.params import GenerationRequest
from handlers.generation.prefix_cache import PrefixCache
from handlers.generation.sampling import new_generator, next_tokens
from handlers.generation.speculation import DraftLength
from handlers.generation.text import TextStream


@dataclass
class Generation:
    """One request's generation: its text so far, its next input token, when its tokens came."""

    key: str
    request: GenerationRequest
    text: TextStream
    generator: Optional[torch.Generator]
    pending: int = -1  # the last token chosen, fed to the model at the next step
    generated: int = 0
    generated_ids: list[int] = field(default_factory=list)
    added: int = 0  # tokens the last step (or the prefill) gave it
    draft: DraftLength = field(default_factory=DraftLength)
    finish: Optional[str] = None  # "stop" (end of text or a stop string) | "length"
    priority: int = 1  # 0 high, 1 normal, 2 low (serving.py schedules by it)
    reused_tokens: int = 0  # prompt tokens whose keys/values came from the prefix cache
    admitted_at: float = field(default_factory=time.perf_counter)
    token_times: list[float] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.finish is not None

    @property
    def length(self) -> int:
        return len(self.request.prompt_ids) + self.generated


class Engine:
    def __init__(self, lm: torch.nn.Module, decode: Callable[[Sequence[int]], str], eos_id: int | Sequence[int],
                 max_positions: int, autocast_dtype: Optional[torch.dtype] = None, drafter: Optional[Drafter] = None,
                 speculate_max_batch: int = 2, max_draft_tokens: int = 8,
                 prefix_cache: Optional[PrefixCache] = None, device: Optional[torch.device] = None,
                 kv_budget_bytes: int = 0) -> None:
        """`eos_id`: the end-of-text id, or several (any of them ends a sequence; the first pads).
        `drafter`: speculative decoding (drafting.py, moved to `device`) for greedy sequences, while the batch holds
        at most `speculate_max_batch` of them. `prefix_cache`: prompts reuse cached prefixes.
        `device`: where the LM's weights are (default: where its first parameter is); every token id,
        mask and position is made there. `kv_budget_bytes`: the most the KV cache may take (0: no limit)."""
        self.lm = lm
        self.kv_budget_bytes = kv_budget_bytes
        self.prefix_cache = prefix_cache
        self.speculate_max_batch = speculate_max_batch
        self.max_draft_tokens = max_draft_tokens
        self.decode = decode
        self.eos_ids: tuple[int, ...] = (eos_id,) if isinstance(eos_id, int) else tuple(eos_id)
        self.eos_id = self.eos_ids[0]
        self._ends = frozenset(self.eos_ids)
        self.max_positions = max_positions
        self.autocast_dtype = autocast_dtype
        self.device = device if device is not None else next(lm.parameters()).device
        self.drafter = drafter.to(self.device) if drafter is not None else None  # drafts where the LM runs
        self.running: list[Generation] = []
        self.kv: Optional[KVBatch] = None

    # ---- the batch -----------------------------------------------------------------------
    def new_sequence(self, key: str, request: GenerationRequest) -> Generation:
        """The request's sequence; OutOfMemory when its cache alone would be over the KV budget."""
        if self.kv_budget_bytes and self._longest(request) * self.kv_bytes_per_token > self.kv_budget_bytes:
            raise OutOfMemory(f"this request's KV cache ({self._longest(request)} tokens) would be over the worker's "
                              f"budget of {self.kv_budget_bytes / 2**20:.0f} MiB: ask for fewer tokens")
        return Generation(key, request, TextStream(self.decode, request.stop), new_generator(request))

    # ---- the KV-cache budget -------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of one token in every layer, at the dtype the cache holds."""
        config = self.lm.config
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        dtype = self.autocast_dtype or next(self.lm.parameters()).dtype
        return 2 * config.num_hidden_layers * kv_heads * head_dim * dtype.itemsize

    def _longest(self, request: GenerationRequest) -> int:
        return min(len(request.prompt_ids) + request.max_new_tokens, self.max_positions)

    def room(self, waiting: Sequence[Generation]) -> int:
        """How many of `waiting`, in order, fit beside the running sequences in the KV budget: the
        cache is one left-padded block, rows x the longest row, every row at its longest."""
        if not self.kv_budget_bytes:
            return len(waiting)
        rows = [self._longest(s.request) for s in self.running]
        fits = 0
        for seq in waiting:
            rows.append(self._longest(seq.request))
            if len(rows) * max(rows) * self.kv_bytes_per_token > self.kv_budget_bytes and (fits or self.running):
                break
            fits += 1
        return fits

    def admit(self, sequences: Sequence[Generation]) -> list[Generation]:
        """Prefill the new sequences and choose each one's first token; they join the running batch
        (unless already finished) and advance with it from the next step on. Prompts without a
        cached prefix are prefilled together; one with a cached prefix reads only the rest. Only as
        many as fit in the KV budget (`room`) are admitted: the others are returned, untouched, to
        wait for running sequences to end."""
        admitted = self.room(sequences)
        sequences, deferred = list(sequences[:admitted]), list(sequences[admitted:])
        if not sequences:
            return deferred
        found = [self.prefix_cache.lookup(s.request.prompt_ids) if self.prefix_cache else None for s in sequences]
        whole = [seq for seq, hit in zip(sequences, found) if hit is None]
        ordered, logits, rows = [], [], []
        if whole:
            ordered.extend(whole)
            out, kv = self._prefill(whole)
            logits.append(out)
            rows.append(kv)
        for seq, hit in zip(sequences, found):
            if hit is not None:
                seq.reused_tokens = hit[0]
                ordered.append(seq)
                out, kv = self._prefill_after(seq, *hit)
                logits.append(out)
                rows.append(kv)
        fresh = rows[0]
        for more in rows[1:]:
            fresh = fresh.merged(more)
        self._choose(ordered, torch.cat(logits))
        alive = [row for row, seq in enumerate(ordered) if not seq.done]
        if alive:
            joined = fresh.kept(alive)
            self.kv = joined if self.kv is None else self.kv.merged(joined)
        self.running.extend(ordered[row] for row in alive)
        return deferred

    def _prefill(self, sequences: list[Generation]) -> tuple[torch.Tensor, KVBatch]:
        width = max(len(s.request.prompt_ids) for s in sequences)
        # Built on the host in one piece, then one copy: a copy per prompt row would cost a launch each.
        ids = torch.full((len(sequences), width), self.eos_id, dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, seq in enumerate(sequences):
            prompt = torch.tensor(seq.request.prompt_ids, dtype=torch.long)
            ids[row, width - len(prompt):] = prompt
            mask[row, width - len(prompt):] = 1
        ids, mask = runtime.to_device(ids, self.device), runtime.to_device(mask, self.device)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        logits, layers = self._forward(ids, mask, positions, None)
        fresh = KVBatch.from_prefill(layers, mask)
        if self.prefix_cache is not None:
            for row, seq in enumerate(sequences):
                size = len(seq.request.prompt_ids)
                self.prefix_cache.store(seq.request.prompt_ids,
                                        [(k[row:row + 1, :, width - size:], v[row:row + 1, :, width - size:])
                                         for k, v in fresh.layers])
        return logits, fresh

    def _prefill_after(self, seq: Generation, cached: int, layers: list) -> tuple[torch.Tensor, KVBatch]:
        """One prompt whose first `cached` tokens' keys/values are `layers`: the model reads the rest."""
        prompt = seq.request.prompt_ids
        ids = torch.tensor([prompt[cached:]], dtype=torch.long, device=self.device)
        mask = torch.ones((1, len(prompt)), dtype=torch.long, device=self.device)
        positions = torch.arange(cached, len(prompt), device=self.device).unsqueeze(0)
        logits, out = self._forward(ids, mask, positions, KVBatch(layers, mask[:, :cached]))
        self.prefix_cache.store(prompt, out)  # a longer prompt is kept, for prompts that share more of it
        return logits, KVBatch(list(out), mask)

    def step(self) -> list[Generation]:
        """One token for every running sequence; returns them (finished ones have left the batch)."""
        if not self.running:
            return []
        if self.drafter and len(self.running) <= self.speculate_max_batch and all(s.request.greedy for s in self.running):
            drafts = [self.drafter.draft(s.key, [*s.request.prompt_ids, *s.generated_ids],
                                         min(s.draft.current, self.max_draft_tokens)) for s in self.running]
            if any(drafts):
                return self._verify(drafts)
        advanced = list(self.running)
        ids = torch.tensor([[seq.pending] for seq in advanced], dtype=torch.long, device=self.device)
        mask = torch.cat([self.kv.mask, torch.ones((len(advanced), 1), dtype=torch.long, device=self.device)], dim=1)
        logits, layers = self._forward(ids, mask, self.kv.positions(), self.kv)
        self.kv = self.kv.extended(layers)
        self._choose(advanced, logits)
        self._keep([seq for seq in advanced if not seq.done])
        return advanced

    def _verify(self, drafts: list[list[int]]) -> list[Generation]:
        """One forward pass over each sequence's next input and its draft; each keeps the drafted
        tokens the model agrees with and the model's own next one. Rejected positions are masked out
        of the cache (their columns stay, as padding the attention skips)."""
        advanced = list(self.running)
        width = max(len(d) for d in drafts)
        # Short drafts are filled with end-of-text: a filler is kept only where it is the model's own choice.
        inputs = [[seq.pending, *d, *[self.eos_id] * (width - len(d))] for seq, d in zip(advanced, drafts)]
        start = self.kv.mask.shape[1]
        mask = torch.cat([self.kv.mask, torch.ones((len(advanced), width + 1), dtype=torch.long, device=self.device)],
                         dim=1)
        positions = self.kv.positions() + torch.arange(width + 1, device=self.device)
        logits, layers = self._forward(torch.tensor(inputs, device=self.device), mask, positions, self.kv,
                                       keep=width + 1)
        choices = logits.argmax(dim=-1).tolist()
        now = time.perf_counter()
        for row, seq in enumerate(advanced):
            drafted = inputs[row][1:]
            agreed = 0
            while agreed < width and drafted[agreed] == choices[row][agreed]:
                agreed += 1
            seq.added = 0
            for token in [*drafted[:agreed], choices[row][agreed]]:
                self._accept(seq, token, now)
                if seq.done:
                    break
            seq.draft.update(len(drafts[row]), min(agreed, len(drafts[row])))
            mask[row, start + agreed + 1:] = 0  # inputs after the last agreed one are not context
        self.kv = KVBatch(list(layers), mask)
        self._keep([seq for seq in advanced if not seq.done])
        return advanced

    def drop(self, keys: Iterable[str]) -> list[Generation]:
        """Remove these sequences now (their client went away, say); returns the ones removed."""
        gone = set(keys)
        removed = [seq for seq in self.running if seq.key in gone]
        if removed:
            self._keep([seq for seq in self.running if seq.key not in gone])
        return removed

    def _keep(self, survivors: list[Generation]) -> None:
        if len(survivors) == len(self.running):
            return
        index = {id(seq): row for row, seq in enumerate(self.running)}
        if self.drafter is not None:
            staying = {id(seq) for seq in survivors}
            for seq in self.running:
                if id(seq) not in staying:
                    self.drafter.forget(seq.key)
        self.kv = self.kv.kept([index[id(seq)] for seq in survivors]) if survivors else None
        self.running = survivors

    @property
    def cache_bytes(self) -> int:
        return 0 if self.kv is None else self.kv.nbytes

    # ---- tokens --------------------------------------------------------------------------
    def _choose(self, sequences: list[Generation], logits: torch.Tensor) -> None:
        tokens = next_tokens(logits, [s.request for s in sequences], [s.generator for s in sequences])
        now = time.perf_counter()
        for seq, token in zip(sequences, tokens):
            seq.added = 0
            self._accept(seq, token, now)

    def _accept(self, seq: Generation, token: int, now: float) -> None:
        seq.generated += 1
        seq.added += 1
        seq.generated_ids.append(token)
        seq.token_times.append(now)
        seq.pending = token
        if token in self._ends and not seq.request.ignore_eos:
            seq.finish = "stop"
            return
        seq.text.add(token)
        if seq.text.stopped:
            seq.finish = "stop"
        elif seq.generated >= seq.request.max_new_tokens or seq.length >= self.max_positions:
            seq.finish = "length"

    # ---- the model -----------------------------------------------------------------------
    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                 kv: Optional[KVBatch], keep: int = 1) -> tuple[torch.Tensor, list]:
        """The logits of the last `keep` positions ((rows, vocab) when keep is 1) and the layers' K/V."""
        from transformers import DynamicCache

        config = self.lm.config
        cache = DynamicCache(ddp_cache_data=kv.layers, config=config) if kv is not None else DynamicCache(config=config)
        with torch.inference_mode(), runtime.autocast(self.device, self.autocast_dtype):
            out = self.lm(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                          use_cache=True, logits_to_keep=keep)
        layers = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        logits = out.logits.float()
        return (logits[:, -1, :] if keep == 1 else logits[:, -keep:, :]), layers

    # ---- whole generations (static batches, benchmarks, tests) ---------------------------
    def generate(self, requests: Sequence[tuple[str, GenerationRequest]],
                 on_step: Optional[Callable[[list[Generation]], None]] = None) -> dict[str, Generation]:
        """Run these requests to the end together; `on_step` sees the sequences each step moved."""
        sequences = [self.new_sequence(key, request) for key, request in requests]
        waiting = self.admit(sequences)
        if on_step is not None:
            on_step(sequences[:len(sequences) - len(waiting)])
        while self.running or waiting:
            moved = self.step()
            if waiting and self.room(waiting):  # room freed by sequences that ended: the next ones start
                started = waiting[:self.room(waiting)]
                waiting = self.admit(waiting)
                moved = [*moved, *started]
            if on_step is not None:
                on_step(moved)
        return {seq.key: seq for seq in sequences}

    def generate_without_cache(self, request: GenerationRequest) -> Generation:
        """The reference: every step recomputes the whole sequence (no KV cache)."""
        seq = self.new_sequence("recompute", request)
        ids = torch.tensor([request.prompt_ids], dtype=torch.long, device=self.device)
        while not seq.done:
            with torch.inference_mode(), runtime.autocast(self.device, self.autocast_dtype):
                logits = self.lm(input_ids=ids, use_cache=False, logits_to_keep=1).logits[:, -1, :].float()
            self._choose([seq], logits)
            ids = torch.cat([ids, torch.tensor([[seq.pending]], device=self.device)], dim=1)
        return seq
