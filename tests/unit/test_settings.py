import dataclasses

import pytest

from handlers.errors import ConfigError
from handlers.settings import HandlerSettings, ImageSettings, RuntimeSettings, TextSettings

pytestmark = pytest.mark.unit


def test_defaults_and_frozen():
    settings = HandlerSettings.from_mapping({"weights": "model.pt"}, ImageSettings)
    assert settings.runtime == RuntimeSettings()
    assert settings.family.image_size == 224
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.runtime.precision = "bf16"


@pytest.mark.parametrize(
    "section, key",
    [
        ({"weights": "m.pt", "runtim": {}}, "runtim"),
        ({"weights": "m.pt", "runtime": {"thread": 2}}, "thread"),
        ({"weights": "m.pt", "model": {"max_lenght": 10}}, "max_lenght"),
        ({"weights": "m.pt", "profiler": {"active_steps": 1}}, "active_steps"),
    ],
)
def test_unknown_key_is_named(section, key):
    with pytest.raises(ConfigError, match=repr(key)):
        HandlerSettings.from_mapping(section, TextSettings)


@pytest.mark.parametrize(
    "runtime, message",
    [
        ({"precision": "int4"}, "precision"),
        ({"graph": "onnx"}, "graph"),
        ({"threads": 0}, "threads"),
        ({"threads": "2"}, "threads"),
        ({"channels_last": "yes"}, "channels_last"),
    ],
)
def test_bad_values_are_refused(runtime, message):
    with pytest.raises(ConfigError, match=message):
        HandlerSettings.from_mapping({"weights": "m.pt", "runtime": runtime}, ImageSettings)


def test_weights_required():
    with pytest.raises(ConfigError, match="weights"):
        HandlerSettings.from_mapping({}, ImageSettings)


def test_values_are_typed():
    settings = HandlerSettings.from_mapping(
        {"weights": "m.pt", "runtime": {"threads": 1, "precision": "bf16"}, "model": {"mean": 127}}, ImageSettings
    )
    assert settings.runtime.threads == 1 and settings.runtime.precision == "bf16"
    assert isinstance(settings.family.mean, float)
