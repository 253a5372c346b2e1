"""Model file of the stock image baseline (torch-model-archiver --model-file): EfficientNet-Lite0.

TorchServe's BaseHandler imports this module, instantiates its only class with no arguments and
loads the state dict (--serialized-file) into it: the eager fp32 path of the docs.
"""

from efficientnet_lite_pytorch import EfficientNet
from efficientnet_lite_pytorch.utils import get_model_params


class EfficientNetLite0(EfficientNet):
    def __init__(self):
        blocks_args, global_params = get_model_params("efficientnet-lite0", {})
        super().__init__(blocks_args, global_params)
