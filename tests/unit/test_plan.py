"""The worker's thread plan, read from the server's config.properties (handlers/plan.py)."""

import pytest

from handlers.errors import ConfigError
from handlers.plan import CONFIG_ENV, planned_threads

pytestmark = pytest.mark.unit

STANZA = ('models={\\\n  "minilm": {"1.0": {"minWorkers": 1, "maxWorkers": 1, "batchSize": 6, "threads": %s}},\\\n'
          '  "digits": {"1.0": {"minWorkers": 1, "maxWorkers": 1}}\\\n  }\n')


def config(tmp_path, threads="1"):
    path = tmp_path / "config.properties"
    path.write_text("# a comment\ninference_address=http://127.0.0.1:8080\n" + STANZA % threads, encoding="utf-8")
    return {CONFIG_ENV: str(path)}


def test_reads_the_models_threads(tmp_path):
    assert planned_threads("minilm", "1.0", config(tmp_path, "3")) == 3


@pytest.mark.parametrize("model, version", [("digits", "1.0"), ("minilm", "2.0"), ("unknown", "1.0")])
def test_no_plan_for_a_model_without_threads(tmp_path, model, version):
    assert planned_threads(model, version, config(tmp_path)) is None


def test_no_variable_no_plan():
    assert planned_threads("minilm", "1.0", {}) is None


@pytest.mark.parametrize("bad", ["0", "-1", "1.5", '"2"', "true"])
def test_a_bad_plan_is_an_error_naming_the_key(tmp_path, bad):
    with pytest.raises(ConfigError, match=r"models\.minilm\.1\.0\.threads"):
        planned_threads("minilm", "1.0", config(tmp_path, bad))


def test_an_unreadable_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=CONFIG_ENV):
        planned_threads("minilm", "1.0", {CONFIG_ENV: str(tmp_path / "missing.properties")})
