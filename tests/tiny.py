"""Tiny models of every family, made in a temp folder: what tests/unit runs its handlers on.

`tiny_project(root)` writes a catalogue whose entries are small random-weight models of each family
(seeded, so every run makes the same ones), with the files they need: model code, weights, a
WordPiece and a byte-level BPE tokenizer trained on a few sentences, labels and examples. The real
build (`build_entry`) turns them into archives in seconds; nothing is downloaded and nothing of the
repository's own build (model_store/) is needed. Their answers are meaningless: tests on them check
the handler's mechanics (decoding, batching, errors, envelopes, caches), not what a model knows.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import yaml

SEED = 0
SENTENCES = ("A man is eating food.", "The new movie is awesome.", "A cat sleeps on the warm windowsill.",
             "The for statement is used to iterate over the elements of a sequence.",
             "A class definition defines a class object, and its suite is executed.",
             "Exceptions are raised when an error is detected during execution.")
LABELS = ("cat", "dog", "bird", "fish")
TENSOR_LABELS = ("low", "middle", "high")
TEXT_WIDTH = 16  # the tiny BERT's hidden size: its embeddings' length
LM_POSITIONS = 128  # room for the longest prompt plus the most new tokens a request may ask for

MODELS_PY = '''
import torch
from torch import nn


class TinyCNN(nn.Module):
    def __init__(self, classes: int = 4):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.head = nn.Linear(4, classes)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).mean(dim=(2, 3)))


class TinyMLP(nn.Module):
    def __init__(self, classes: int = 3):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, classes))

    def forward(self, x):
        return self.body(x / 16.0)


class TinyForecaster(nn.Module):
    def __init__(self, window: int = 8, horizon: int = 4, quantiles: int = 3):
        super().__init__()
        self.horizon, self.quantiles = horizon, quantiles
        self.body = nn.Linear(window, horizon * quantiles)

    def forward(self, history):
        level = history[:, -1:]
        out = self.body(history - level)
        return out.view(-1, self.horizon, self.quantiles) + level.unsqueeze(-1)
'''


def _save_state(module: torch.nn.Module, path: Path) -> None:
    torch.save(module.state_dict(), path)


def _wordpiece(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer.train_from_iterator(SENTENCES * 4, trainers.WordPieceTrainer(vocab_size=200, special_tokens=specials))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls),
                                                                                                     ("[SEP]", sep)])
    tokenizer.save(str(folder / "tokenizer.json"))


def _byte_bpe(folder: Path, specials=("<|endoftext|>",)) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=list(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(SENTENCES * 4, trainer=trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    return tokenizer.get_vocab_size()


def _bert(folder: Path) -> None:
    from transformers import BertConfig, BertModel

    folder.mkdir(parents=True)
    _wordpiece(folder)
    vocab = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]
    config = BertConfig(vocab_size=len(vocab), hidden_size=TEXT_WIDTH, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64, pad_token_id=vocab["[PAD]"])
    BertModel(config).save_pretrained(str(folder), safe_serialization=True)


def _gpt2(folder: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    folder.mkdir(parents=True)
    vocab = _byte_bpe(folder)
    # Weights far larger than GPT-2's 0.02 initialisation: then the context, not just the last token,
    # decides the next one, so a batching or masking fault changes the text instead of going unseen.
    config = GPT2Config(vocab_size=vocab, n_positions=LM_POSITIONS, n_embd=16, n_layer=1, n_head=2, bos_token_id=0,
                        eos_token_id=0, initializer_range=0.5)
    GPT2LMHeadModel(config).save_pretrained(str(folder), safe_serialization=True)


LLAMA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}"
                  "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


def tiny_llama(folder: Path, seed: int = SEED) -> Path:
    """A Llama-style folder as a user would bring it: rotary positions, RMSNorm, grouped-query
    attention (2 key/value heads for 4 query heads), its own byte-level BPE with <s> </s> <unk>,
    tokenizer_config.json (start and end tokens, add_bos_token, a chat template) and
    generation_config.json; no GPT-2 token anywhere."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    folder.mkdir(parents=True)
    vocab = _byte_bpe(folder, ("<s>", "</s>", "<unk>"))
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, bos_token_id=0,
                         eos_token_id=1, pad_token_id=None, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=1)
    model.save_pretrained(str(folder), safe_serialization=True)
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
         "chat_template": LLAMA_TEMPLATE}, indent=2))
    return folder


def llama_archive(llama: Path, root: Path, causal_lm: dict, chat_jinja: Optional[str] = None) -> Path:
    """The real build of a one-entry catalogue serving the Llama folder `llama` as a user writes it
    (no token settings; `causal_lm`: limits and the like); `chat_jinja`: a chat_template.jinja
    beside its files, as transformers 5 saves one. Returns the archive (under root/store)."""
    import shutil

    import build.speed
    from build.archive import build_entry
    from build.catalogue import Catalogue

    shutil.copytree(llama, root / "llama")
    if chat_jinja is not None:
        (root / "llama" / "chat_template.jinja").write_text(chat_jinja)
    entry = {"version": "1.0", "family": "causal_lm", "model": {"huggingface": {"path": "llama"}},
             "settings": {"runtime": {"precision": "fp32", "warmup": False}, "causal_lm": causal_lm},
             "examples": [{"json": {"prompt": "The for statement", "max_new_tokens": 4}}]}
    (root / "catalogue.yaml").write_text(yaml.safe_dump({"models": {"llama": entry}}))
    saved, build.speed.SECONDS = build.speed.SECONDS, 0.05  # the report's speed figures: not what is tested
    try:
        return build_entry(Catalogue.load(root / "catalogue.yaml"), "llama", root, root / "store",
                           progress=lambda _: None).archive
    finally:
        build.speed.SECONDS = saved


def _jpeg(seed: int) -> bytes:
    import io

    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (40, 56, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def catalogue_entries() -> dict:
    """The tiny catalogue: one entry per family (paths relative to the project folder)."""
    runtime = {"precision": "fp32", "warmup": False}
    return {
        "tiny_image": {
            "version": "1.0", "family": "image_classifier",
            "model": {"python": "tiny_code/models.py", "class": "TinyCNN", "weights": {"path": "tiny_cnn.pt"}},
            "serialisation": "state_dict",
            "extra_files": [{"path": "labels.json"}],
            "settings": {"runtime": runtime,
                         "image_classifier": {"labels": "labels.json", "image_size": 16, "resize_size": 20,
                                              "mean": [127], "std": [128], "top_k": 3}},
            "examples": [{"path": "image_0.jpg"}, {"path": "image_1.jpg"}],
            "slo_ms": 50,
        },
        "tiny_text": {
            "version": "1.0", "family": "text_embedder",
            "model": {"huggingface": {"path": "tiny_bert"}},
            "serialisation": "state_dict",
            "settings": {"runtime": runtime, "text_embedder": {"max_length": 32, "pad_bucket": 8}},
            "examples": [{"json": {"text": s}} for s in SENTENCES[:3]],
            "slo_ms": 50,
        },
        "tiny_tensor": {
            "version": "1.0", "family": "tensor",
            "model": {"python": "tiny_code/models.py", "class": "TinyMLP", "weights": {"path": "tiny_mlp.pt"}},
            "serialisation": "state_dict",
            "extra_files": [{"path": "tensor_labels.json"}],
            "settings": {"runtime": runtime,
                         "tensor": {"shape": [1, 4, 4], "dtype": "float32", "min": 0, "max": 16,
                                    "output": "softmax_topk", "labels": "tensor_labels.json", "top_k": 2}},
            "examples": [{"json": {"inputs": np.full((1, 4, 4), float(v)).tolist()}} for v in (1, 8)],
            "slo_ms": 50,
        },
        "tiny_forecast": {
            "version": "1.0", "family": "quantile_forecaster",
            "model": {"python": "tiny_code/models.py", "class": "TinyForecaster", "weights": {"path": "tiny_forecast.pt"}},
            "serialisation": "state_dict",
            "settings": {"runtime": runtime,
                         "quantile_forecaster": {"window": 8, "horizon": 4, "quantiles": [0.1, 0.5, 0.9], "min": 0}},
            "examples": [{"json": {"history": [10.0 + i for i in range(8)]}},
                         {"json": {"history": [5.0] * 12, "horizon": 2, "thresholds": [5.0], "alert_within": 2}}],
            "slo_ms": 50,
        },
        "tiny_lm": {
            "version": "1.0", "family": "causal_lm",
            "model": {"huggingface": {"path": "tiny_gpt2"}},
            "settings": {"runtime": runtime,
                         # The step mode: the generation unit tests drive it call by call; async tests switch.
                         "causal_lm": {"max_prompt_tokens": 64, "max_new_tokens": 64, "default_max_new_tokens": 8,
                                       "mode": "step"}},
            "examples": [{"json": {"prompt": "The for statement", "max_new_tokens": 4}}],
            "slo_ms": 100,
        },
    }


def tiny_project(root: Path) -> Path:
    """Write the tiny models' folder and catalogue; returns the catalogue's path."""
    torch.manual_seed(SEED)
    root.mkdir(parents=True, exist_ok=True)
    # A Python source is staged with its whole folder: the code lives apart from everything else.
    (root / "tiny_code").mkdir()
    (root / "tiny_code" / "models.py").write_text(textwrap.dedent(MODELS_PY))
    namespace: dict = {}
    exec(compile(MODELS_PY, "tiny_models.py", "exec"), namespace)  # noqa: S102 - our own code above
    _save_state(namespace["TinyCNN"](), root / "tiny_cnn.pt")
    _save_state(namespace["TinyMLP"](), root / "tiny_mlp.pt")
    _save_state(namespace["TinyForecaster"](), root / "tiny_forecast.pt")
    (root / "labels.json").write_text(json.dumps(list(LABELS)))
    (root / "tensor_labels.json").write_text(json.dumps(list(TENSOR_LABELS)))
    for i in range(2):
        (root / f"image_{i}.jpg").write_bytes(_jpeg(i))
    _bert(root / "tiny_bert")
    _gpt2(root / "tiny_gpt2")
    catalogue = root / "catalogue.yaml"
    catalogue.write_text(yaml.safe_dump({"models": catalogue_entries()}, sort_keys=False))
    return catalogue
