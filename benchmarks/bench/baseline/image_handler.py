"""Stock-style image classifier, as TorchServe's ImageClassifier/VisionHandler examples write it.

BaseHandler loads the eager fp32 model (model file + state dict) and the index_to_name.json labels;
each request is decoded with PIL at full size, resized (shorter side to `resize`), centre-cropped
to `crop` and normalised on its own, then the batch is stacked. No thread settings, no precision
change. The geometry comes from baseline.json, written from the catalogue entry's settings.
"""

import base64
import io
import json
import logging
import os

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from ts.torch_handler.base_handler import BaseHandler
from ts.utils.util import map_class_to_label

logger = logging.getLogger(__name__)


def stock_pixels(data, resize, crop, mean, std, grey=False):
    """One image's CHW float tensor the textbook way: full decode, bilinear resize of the shorter
    side, centre crop, normalisation in 0..255 pixel units (one value, or one per channel)."""
    image = Image.open(io.BytesIO(data)).convert("L" if grey else "RGB")
    width, height = image.size
    scale = resize / min(width, height)
    image = image.resize((round(width * scale), round(height * scale)), Image.BILINEAR)
    left, top = (image.width - crop) // 2, (image.height - crop) // 2
    image = image.crop((left, top, left + crop, top + crop))
    pixels = np.asarray(image, dtype=np.float32).reshape(crop, crop, -1)
    pixels = (pixels - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return torch.from_numpy(pixels).permute(2, 0, 1)


class NaiveImageClassifier(BaseHandler):
    def initialize(self, context):
        super().initialize(context)
        with open(os.path.join(context.system_properties["model_dir"], "baseline.json")) as handle:
            self.geometry = json.load(handle)
        logger.info("baseline ready: torch threads=%d", torch.get_num_threads())

    def preprocess(self, data):
        g = self.geometry
        images = []
        for row in data:
            image = row.get("data") or row.get("body")
            if isinstance(image, str):
                image = base64.b64decode(image)
            images.append(stock_pixels(image, g["resize"], g["crop"], g["mean"], g["std"], g["grey"]))
        return torch.stack(images).to(self.device)

    def postprocess(self, data):
        probabilities = F.softmax(data, dim=1)
        probs, classes = torch.topk(probabilities, min(self.geometry["top_k"], data.shape[1]), dim=1)
        return map_class_to_label(probs.tolist(), self.mapping, classes.tolist())
