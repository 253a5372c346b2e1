"""TorchServe's url_path -> the OpenAI endpoint (handlers/openai/routes.py), 404s in OpenAI's
shape for the rest, and v1/models (handlers/openai/models.py)."""

from __future__ import annotations

import json

import pytest

from handlers.openai import routes
from handlers.openai.errors import OpenAIError, error_body
from handlers.openai.models import model_response, models_response
from tests.unit import openai_shapes as shapes

pytestmark = pytest.mark.unit

MODEL = "tinylm"


# ---- routes --------------------------------------------------------------------------------------
@pytest.mark.parametrize("url_path, endpoint", [
    ("v1/completions", routes.COMPLETIONS), ("v1/chat/completions", routes.CHAT), ("v1/models", routes.MODELS),
    ("/v1/chat/completions/", routes.CHAT),
])
def test_generation_routes(url_path, endpoint):
    assert routes.is_openai(url_path)
    assert routes.route(url_path, routes.GENERATION_ENDPOINTS) == routes.Route(endpoint)


def test_the_model_route_takes_ids_with_slashes():
    assert routes.route("v1/models/org/tiny-lm", routes.GENERATION_ENDPOINTS) == routes.Route(routes.MODEL,
                                                                                                "org/tiny-lm")


def test_the_embeddings_route_is_an_embedders():
    assert routes.route("v1/embeddings", routes.EMBEDDING_ENDPOINTS) == routes.Route(routes.EMBEDDINGS)
    assert routes.route("v1/models", routes.EMBEDDING_ENDPOINTS) == routes.Route(routes.MODELS)


@pytest.mark.parametrize("url_path, endpoints", [
    ("v1/embeddings", routes.GENERATION_ENDPOINTS),
    ("v1/chat/completions", routes.EMBEDDING_ENDPOINTS),
    ("v1/completions", routes.EMBEDDING_ENDPOINTS),
    ("v1/responses", routes.GENERATION_ENDPOINTS),
    ("v1", routes.GENERATION_ENDPOINTS),
    ("v1/models/", routes.EMBEDDING_ENDPOINTS - {routes.MODELS}),
])
def test_other_v1_paths_are_404s_in_openais_shape(url_path, endpoints):
    with pytest.raises(OpenAIError) as caught:
        routes.route(url_path, endpoints)
    body = shapes.validate(shapes.ErrorBody, error_body(caught.value))
    assert caught.value.status == 404 and "Invalid URL" in body.error.message


@pytest.mark.parametrize("url_path", ["", None, "v2/models", "explain", "v10/completions"])
def test_paths_outside_v1_are_not_openais(url_path):
    assert not routes.is_openai(url_path)


# ---- models ----------------------------------------------------------------------------------------
def test_models_lists_the_served_model():
    page = shapes.validate(shapes.ModelList, models_response(MODEL, 1718000000))
    assert [(m.id, m.created, m.owned_by) for m in page.data] == [(MODEL, 1718000000, "torchserve")]


def test_one_model_is_retrieved_by_its_name_or_an_alias_else_404():
    assert shapes.validate(shapes.Model, model_response(MODEL, MODEL, 7)).id == MODEL
    assert shapes.validate(shapes.Model, model_response("alias", MODEL, 7, aliases=("alias",))).id == "alias"
    with pytest.raises(OpenAIError) as caught:
        model_response("gpt-4o", MODEL, 7)
    assert caught.value.status == 404 and json.loads(error_body(caught.value))["error"]["code"] == "model_not_found"
