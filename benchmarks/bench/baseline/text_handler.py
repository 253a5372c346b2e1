"""Stock-style sentence embedder, as TorchServe's Hugging Face transformer example writes it.

AutoTokenizer/AutoModel from the archive's files, eager fp32; every request tokenised on its own
and padded to max_length 128, then mean pooling and L2 normalisation (sentence-transformers' recipe, the one
function every path here shares: the archive carries the handlers package for it).
No thread settings, no precision change, no dynamic padding.
"""

import logging

import torch
from transformers import AutoModel, AutoTokenizer
from ts.torch_handler.base_handler import BaseHandler

from handlers.families.pooling import mean_pool

logger = logging.getLogger(__name__)

MAX_LENGTH = 128


class NaiveTextEmbedder(BaseHandler):
    def initialize(self, context):
        model_dir = context.system_properties.get("model_dir")
        gpu_id = context.system_properties.get("gpu_id")
        use_cuda = torch.cuda.is_available() and gpu_id is not None
        self.device = torch.device(f"cuda:{gpu_id}" if use_cuda else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModel.from_pretrained(model_dir).to(self.device).eval()
        self.initialized = True
        logger.info("baseline ready: torch threads=%d", torch.get_num_threads())

    def preprocess(self, requests):
        ids, masks = [], []
        for data in requests:
            text = data.get("data") or data.get("body")
            if isinstance(text, (bytes, bytearray)):
                text = text.decode("utf-8")
            if isinstance(text, dict):
                text = text["text"]
            # The example's tokenizer.encode_plus(...); transformers 5 spells it tokenizer(...).
            inputs = self.tokenizer(
                text, max_length=MAX_LENGTH, padding="max_length", add_special_tokens=True,
                return_tensors="pt", truncation=True,
            )
            ids.append(inputs["input_ids"])
            masks.append(inputs["attention_mask"])
        return torch.cat(ids).to(self.device), torch.cat(masks).to(self.device)

    def inference(self, data, *args, **kwargs):
        input_ids, attention_mask = data
        with torch.inference_mode():
            hidden = self.model(input_ids, attention_mask=attention_mask).last_hidden_state
        return mean_pool(hidden, attention_mask)

    def postprocess(self, data):
        return [{"embedding": row} for row in data.tolist()]
