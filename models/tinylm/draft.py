"""The draft model for speculative decoding: a one-layer GRU language model over tinylm's
tokenizer, distilled from tinylm (it learns tinylm's next-token distribution, not the text's), so
that its guesses are the ones tinylm would make.

Why a GRU and not a smaller GPT-2: on a CPU a step of a small transformer costs mostly its
per-layer overhead (a 1-layer, 64-wide GPT-2 step takes a third of tinylm's), which leaves
speculation little to gain; a GRU step is three small kernels. It ships as TorchScript (`draft.pt`):
`forward(ids (rows, time), state) -> (logits (rows, time, vocab), state)` and
`initial_state(rows)`, the interface handlers/generation/drafting.py runs.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

EMBED = 128
HIDDEN = 384
STEPS = 400
BATCH = 32
LEARNING_RATE = 3e-3


class RecurrentDraft(torch.nn.Module):
    def __init__(self, vocab: int, embed: int = EMBED, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.hidden = hidden
        self.embed = torch.nn.Embedding(vocab, embed)
        self.gru = torch.nn.GRU(embed, hidden, batch_first=True)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, state = self.gru(self.embed(ids), state)
        return self.head(out), state

    @torch.jit.export
    def initial_state(self, rows: int) -> torch.Tensor:
        return torch.zeros(1, rows, self.hidden)


def distil(teacher: torch.nn.Module, train_windows: torch.Tensor, held_windows: torch.Tensor, out: Path,
           seed: int) -> dict:
    """Train the draft on the teacher's next-token distributions over the training windows (KL);
    write it as TorchScript; return how often its top-1 equals the teacher's on held-out text."""
    torch.manual_seed(seed)
    started = time.perf_counter()
    teacher.eval()
    draft = RecurrentDraft(teacher.config.vocab_size)
    optimiser = torch.optim.AdamW(draft.parameters(), lr=LEARNING_RATE, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: 0.5 * (1 + math.cos(math.pi * s / STEPS)))
    generator = torch.Generator().manual_seed(seed)
    for step in range(STEPS):
        batch = train_windows[torch.randint(len(train_windows), (BATCH,), generator=generator)][:, :-1]
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            target = torch.log_softmax(teacher(input_ids=batch).logits.float(), dim=-1)
        logits, _ = draft(batch, draft.initial_state(len(batch)))
        loss = torch.nn.functional.kl_div(torch.log_softmax(logits, dim=-1).flatten(0, 1), target.flatten(0, 1),
                                          log_target=True, reduction="batchmean")
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optimiser.step()
        schedule.step()
        if (step + 1) % 100 == 0:
            print(f"  tinylm draft: step {step + 1}/{STEPS} KL {loss.item():.3f} "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
    with torch.no_grad():  # rounded to what the fp16 file keeps before it is measured
        for parameter in draft.parameters():
            parameter.copy_(parameter.half().float())
    agreement = top1_agreement(teacher, draft.eval(), held_windows[:, :-1])
    torch.jit.save(torch.jit.script(draft.half()), str(out))  # fp16 on disk: a worker loads it into fp32
    return {"kind": "gru", "embed": EMBED, "hidden": HIDDEN, "steps": STEPS,
            "held_out_top1_agreement": round(agreement, 4), "seconds": round(time.perf_counter() - started, 1)}


def top1_agreement(teacher: torch.nn.Module, draft: RecurrentDraft, held: torch.Tensor) -> float:
    agree = total = 0
    with torch.no_grad():
        for batch in held.split(32):
            mine = draft(batch, draft.initial_state(len(batch)))[0].argmax(-1)
            theirs = teacher(input_ids=batch).logits.argmax(-1)
            agree += int((mine == theirs).sum())
            total += mine.numel()
    return agree / total
