"""A small GPT-2 trained here, on text that ships with Python: the standard library's
`pydoc_data.topics` (~0.47 MB of the language reference, real English documentation). No weights
can be downloaded, so this is the causal-LM family's shipped example. `make build` calls
`train(out)` through `make retrain SCRIPT=models/tinylm/train.py` (build/training.py), which
ships its output in `trained/` beside this file: 5-20 minutes on 2 cores, so `make build` uses the
shipped folder and trains nothing.

    .venv/bin/python -m models.tinylm.train      # trains into a temp folder, prints the figures

Writes a Hugging Face folder: config.json + model.safetensors (GPT2LMHeadModel) + tokenizer.json
(byte-level BPE trained with `tokenizers` on the same training text), and `draft.pt`: the draft
model for speculative decoding (draft.py), distilled from the trained model on the same text.
Both are stored in fp16, half the size in git (a worker loads them into fp32): the weights are
rounded to fp16 before the figures are measured, so the figures are those of the shipped files.

Every 8th step trains on one window of the whole context (1,536 tokens), so that every position
(a 1,000-token shared prefix, say) has trained embeddings and attention that spans it.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

SEED = 20261123
VOCAB = 2048
EOS = "<|endoftext|>"
CONTEXT = 128
BATCH = 16
STEPS = 1000
LEARNING_RATE = 3e-3
DROPOUT = 0.1  # 100k training tokens: without it the model learns them by heart
HELD_OUT_EVERY = 10  # every 10th paragraph is held out: never trained on
ARCHITECTURE = dict(n_layer=4, n_head=4, n_embd=192, n_positions=1536)
LONG_EVERY = 8  # every 8th step: one window of the whole context instead of BATCH short ones


def topics() -> tuple[list[str], list[str]]:
    """(training texts, held-out texts): every 10th paragraph of every topic is held out, so
    held-out text is text the model never saw, from all parts of the reference."""
    from pydoc_data.topics import topics as all_topics

    train, held = [], []
    for name in sorted(all_topics):
        paragraphs = [p for p in all_topics[name].split("\n\n") if p.strip()]
        train.append("\n\n".join(p for i, p in enumerate(paragraphs) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1))
        held.append("\n\n".join(p for i, p in enumerate(paragraphs) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1))
    return train, [h for h in held if h]


def train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def token_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """Every text's tokens, each followed by the end-of-text token, as one long 1-D tensor."""
    eos = tokenizer.token_to_id(EOS)
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(texts):
        ids.extend(encoding.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def windows(stream: torch.Tensor, length: int) -> torch.Tensor:
    """Non-overlapping windows of length + 1 tokens (inputs and their next-token targets)."""
    count = (len(stream) - 1) // length
    return torch.stack([stream[i * length: i * length + length + 1] for i in range(count)])


def perplexity(model, held: torch.Tensor) -> float:
    model.eval()
    losses = []
    with torch.no_grad():
        for batch in held.split(32):
            out = model(input_ids=batch[:, :-1], labels=batch[:, :-1])
            losses.append(out.loss.item() * len(batch))
    return math.exp(sum(losses) / len(held))


def train(out: Path) -> dict:
    """Write a Hugging Face folder into `out`; return held-out perplexity and a sample. Same seed,
    same inputs, same weights."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(SEED)
    started = time.perf_counter()
    train_texts, held_texts = topics()
    tokenizer = train_tokenizer(train_texts)
    eos = tokenizer.token_to_id(EOS)
    train_windows = windows(token_stream(tokenizer, train_texts), CONTEXT)
    held_windows = windows(token_stream(tokenizer, held_texts), CONTEXT)
    long_windows = windows(token_stream(tokenizer, train_texts), ARCHITECTURE["n_positions"] - 1)
    config = GPT2Config(vocab_size=tokenizer.get_vocab_size(), bos_token_id=eos, eos_token_id=eos,
                        resid_pdrop=DROPOUT, embd_pdrop=DROPOUT, attn_pdrop=DROPOUT, **ARCHITECTURE)
    model = GPT2LMHeadModel(config)
    optimiser = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.1, betas=(0.9, 0.95))
    warmup = STEPS // 20
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / STEPS))))
    generator = torch.Generator().manual_seed(SEED)
    print(f"  tinylm: {len(train_windows)} training windows of {CONTEXT} tokens, {len(held_windows)} held out; "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters; {STEPS} steps", flush=True)
    model.train()
    for step in range(STEPS):
        if step % LONG_EVERY == LONG_EVERY - 1:
            batch = long_windows[torch.randint(len(long_windows), (1,), generator=generator)]
        else:
            batch = train_windows[torch.randint(len(train_windows), (BATCH,), generator=generator)]
        with torch.autocast("cpu", dtype=torch.bfloat16):  # ~1.8x faster here; weights and optimiser stay fp32
            loss = model(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        schedule.step()
        if (step + 1) % 100 == 0:
            print(f"  tinylm: step {step + 1}/{STEPS} loss {loss.item():.2f}, held-out perplexity "
                  f"{perplexity(model, held_windows):.1f} ({time.perf_counter() - started:.0f} s)", flush=True)
            model.train()
    round_to_half(model)
    held_ppl = perplexity(model, held_windows)
    unigram_ppl = unigram_perplexity(token_stream(tokenizer, train_texts), held_windows[:, :-1].reshape(-1),
                                     tokenizer.get_vocab_size())
    model.half().save_pretrained(str(out), safe_serialization=True)
    model.float()
    tokenizer.save(str(Path(out) / "tokenizer.json"))
    sample = greedy_sample(model, tokenizer, "The for statement is used to", 24)
    from models.tinylm.draft import distil

    draft_figures = distil(model, train_windows, held_windows, Path(out) / "draft.pt", SEED)
    return {"held_out_perplexity": round(held_ppl, 2), "unigram_held_out_perplexity": round(unigram_ppl, 2),
            "held_out_tokens": int(held_windows[:, :-1].numel()),
            "vocab": tokenizer.get_vocab_size(), "steps": STEPS, "seed": SEED, **ARCHITECTURE,
            "seconds": round(time.perf_counter() - started, 1), "sample": sample, "draft": draft_figures}


def round_to_half(module: torch.nn.Module) -> None:
    """Weights rounded to what fp16 storage keeps, in place (they stay fp32)."""
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(parameter.half().float())


def unigram_perplexity(train: torch.Tensor, held: torch.Tensor, vocab: int) -> float:
    """The yardstick: a model that knows only how often each token occurs (add-one smoothed)."""
    counts = torch.bincount(train, minlength=vocab).double() + 1.0
    log_probs = torch.log(counts / counts.sum())
    return math.exp(-log_probs[held].mean().item())


def greedy_sample(model, tokenizer, prompt: str, tokens: int) -> str:
    model.eval()
    ids = torch.tensor([tokenizer.encode(prompt).ids])
    with torch.no_grad():
        for _ in range(tokens):
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1:].argmax(-1)], dim=1)
    return tokenizer.decode(ids[0].tolist())


def write_held_out(count: int = 48, words: int = 8) -> None:
    """held_out.jsonl: prompts cut from held-out paragraphs (never trained on), one request per line,
    for the build's accuracy gate (its next-token check)."""
    import random

    paragraphs = [p.strip() for text in topics()[1] for p in text.split("\n\n") if len(p.split()) >= 2 * words]
    chosen = random.Random(SEED).sample(paragraphs, count)
    lines = [json.dumps({"prompt": " ".join(p.split()[:words]), "max_new_tokens": 1}) for p in chosen]
    (Path(__file__).resolve().parent / "held_out.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        figures = train(Path(tmp))
    json.dump(figures, sys.stdout, indent=2)
    print()
    write_held_out()
