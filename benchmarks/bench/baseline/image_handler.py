"""Stock-style image classifier, as TorchServe's ImageClassifier/VisionHandler examples write it.

BaseHandler loads the eager fp32 model (model file + state dict) and the index_to_name.json labels;
each request is decoded with PIL at full size, resized (shorter side 256), centre-cropped to 224
and normalised on its own, then the batch is stacked. No thread settings, no precision change.
"""

import base64
import io
import logging

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from ts.torch_handler.base_handler import BaseHandler
from ts.utils.util import map_class_to_label

logger = logging.getLogger(__name__)

RESIZE = 256
CROP = 224
MEAN, STD = 127.0, 128.0  # EfficientNet-Lite's input normalisation, on 0..255 pixels


class NaiveImageClassifier(BaseHandler):
    topk = 5

    def initialize(self, context):
        super().initialize(context)
        logger.info("baseline ready: torch threads=%d", torch.get_num_threads())

    def preprocess(self, data):
        images = []
        for row in data:
            image = row.get("data") or row.get("body")
            if isinstance(image, str):
                image = base64.b64decode(image)
            image = Image.open(io.BytesIO(image)).convert("RGB")
            width, height = image.size
            scale = RESIZE / min(width, height)
            image = image.resize((round(width * scale), round(height * scale)), Image.BILINEAR)
            left, top = (image.width - CROP) // 2, (image.height - CROP) // 2
            image = image.crop((left, top, left + CROP, top + CROP))
            pixels = torch.from_numpy(np.asarray(image, dtype=np.float32)).permute(2, 0, 1)
            images.append((pixels - MEAN) / STD)
        return torch.stack(images).to(self.device)

    def postprocess(self, data):
        probabilities = F.softmax(data, dim=1)
        probs, classes = torch.topk(probabilities, self.topk, dim=1)
        return map_class_to_label(probs.tolist(), self.mapping, classes.tolist())
