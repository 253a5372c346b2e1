"""Handler settings: one frozen object from the archive's handler section; unknown keys, wrong
types, out-of-range values and impossible combinations refused, naming the key."""

import dataclasses

import pytest

from handlers.errors import ConfigError
from handlers.families.image_classifier import ImageSettings
from handlers.settings import HandlerSettings, RuntimeSettings
from handlers.sources import HuggingFaceSource, ModuleSource

pytestmark = pytest.mark.unit

TORCHSCRIPT = {"family": "image_classifier", "weights": "model.ts", "runtime": {"graph": "torchscript"}}
EAGER = {"family": "text_embedder", "weights": "model.pt", "source": {"huggingface": "hf"}}


def test_defaults_and_frozen():
    settings = HandlerSettings.from_mapping(TORCHSCRIPT)
    assert settings.runtime == RuntimeSettings(graph="torchscript")
    assert settings.family_settings == ImageSettings() and settings.family_settings.image_size == 224
    assert settings.source is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.runtime.precision = "bf16"


def test_sources():
    assert HandlerSettings.from_mapping(EAGER).source == HuggingFaceSource("hf")
    module = HandlerSettings.from_mapping({**EAGER, "source": {"module": "m", "attribute": "A.make", "args": {"k": 1}}})
    assert module.source == ModuleSource("m", "A.make", {"k": 1})


@pytest.mark.parametrize(
    "section, words",
    [
        ({**TORCHSCRIPT, "runtim": {}}, "unknown key 'runtim'"),
        ({**TORCHSCRIPT, "runtime": {"graph": "torchscript", "thread": 2}}, "unknown key 'thread'"),
        ({**TORCHSCRIPT, "image_classifier": {"max_lenght": 10}}, "unknown key 'max_lenght'"),
        ({**TORCHSCRIPT, "text_embedder": {}}, "unknown key 'text_embedder'"),  # another family's section
        ({**TORCHSCRIPT, "profiler": {"active_steps": 1}}, "unknown key 'active_steps'"),
        ({**TORCHSCRIPT, "family": "sculpture"}, "family 'sculpture' is not one of"),
        ({"weights": "m.pt"}, "family: the model family is required"),
        ({"family": "tensor"}, "weights"),
        ({**EAGER, "source": None}, "an eager archive needs one"),
        ({**TORCHSCRIPT, "source": {"huggingface": "hf"}}, "a TorchScript, ONNX or AOTInductor one has none"),
        ({**EAGER, "source": {"module": "m"}}, "expected {module, attribute"),
        ({**TORCHSCRIPT, "image_classifier": {"resize_size": 100}}, "resize_size: must be >= image_size"),
        ({**TORCHSCRIPT, "image_classifier": {"mean": [1, 2]}}, "one value or one per channel"),
        ({**TORCHSCRIPT, "image_classifier": {"std": [0]}}, "std: must be > 0"),
        ({**EAGER, "text_embedder": {"pooling": "max"}}, "is not one of ['mean', 'cls']"),
        ({"family": "tensor", "weights": "m.ts", "runtime": {"graph": "torchscript"}}, "tensor.shape"),
        ({"family": "tensor", "weights": "m.ts", "runtime": {"graph": "torchscript"},
          "tensor": {"shape": [4], "max_elements": 2}}, "max_elements"),
    ],
)
def test_bad_sections_are_refused_by_name(section, words):
    with pytest.raises(ConfigError) as refused:
        HandlerSettings.from_mapping(section)
    assert words in str(refused.value)


@pytest.mark.parametrize(
    "runtime, message",
    [
        ({"precision": "int4"}, "precision"),
        ({"graph": "tensorrt"}, "graph"),
        ({"threads": 0}, "threads"),
        ({"threads": "2"}, "threads"),
        ({"channels_last": "yes"}, "channels_last"),
    ],
)
def test_bad_runtime_values_are_refused(runtime, message):
    with pytest.raises(ConfigError, match=message):
        HandlerSettings.from_mapping({**EAGER, "runtime": runtime})


def test_values_are_typed():
    settings = HandlerSettings.from_mapping(
        {**TORCHSCRIPT, "runtime": {"graph": "torchscript", "threads": 1, "precision": "bf16"},
         "image_classifier": {"mean": [127, 120, 110], "std": [64]}})
    assert settings.runtime.threads == 1 and settings.runtime.precision == "bf16"
    assert settings.family_settings.mean == (127.0, 120.0, 110.0) and settings.family_settings.std == (64.0,)
