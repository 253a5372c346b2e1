"""Model families, registered in one place: a catalogue entry names its family here.

A new family is a `Family` subclass in this folder and one line in FAMILIES.
"""

from __future__ import annotations

from handlers.errors import ConfigError
from handlers.families.causal_lm import CausalLM
from handlers.families.forecaster import QuantileForecaster
from handlers.families.image_classifier import ImageClassifier
from handlers.families.tensor import TensorModel
from handlers.families.text_embedder import TextEmbedder

FAMILIES: dict[str, type] = {family.name: family for family in (ImageClassifier, TextEmbedder, TensorModel, CausalLM,
                                                             QuantileForecaster)}


def family_class(name: str) -> type:
    if name not in FAMILIES:
        raise ConfigError(f"family {name!r} is not one of {sorted(FAMILIES)} (handlers/families/registry.py)")
    return FAMILIES[name]
