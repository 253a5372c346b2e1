"""The bench's default is the short form (the figures asked first); the long form is one flag away."""

import pytest

from benchmarks.bench.options import FULL_FRACTIONS, LOW_LOAD_FRACTION, config_from, parser
from benchmarks.load.errors import BenchmarkError
from build.catalogue import Catalogue
from serving.repo import CATALOGUE

pytestmark = pytest.mark.unit

MODEL = Catalogue.load(CATALOGUE).names_of(generating=False)[0]


def config(*args):
    argv = ["--model", MODEL, *args]
    return config_from(parser().parse_args(argv), argv)


def test_the_default_is_one_client_then_the_capacity_search_and_the_low_load_tail():
    cfg = config()
    assert cfg.plan.levels == (1,) and cfg.plan.min_gain_pct is None
    assert cfg.plan.rates == () and cfg.plan.rate_fractions == ()  # the search starts from the in-process limit
    assert cfg.plan.capacity_points > 0 and cfg.plan.low_load_fraction == LOW_LOAD_FRACTION
    assert not cfg.stock and not cfg.ceiling


def test_the_long_form_sweeps_and_measures_both_references():
    cfg = config("--full")
    assert cfg.plan.levels[:3] == (1, 2, 4) and cfg.plan.min_gain_pct is not None
    assert cfg.plan.rate_fractions == FULL_FRACTIONS and cfg.stock and cfg.ceiling


def test_each_reference_on_its_own():
    assert config("--stock").stock and not config("--stock").ceiling
    assert config("--ceiling").ceiling and not config("--ceiling").stock
    assert config("--stock").stock_plan.rate_fractions == FULL_FRACTIONS  # the baseline: fractions of its own peak


def test_fractions_without_a_peak_to_take_them_of_are_refused():
    with pytest.raises(BenchmarkError, match="--rate-fractions"):
        config("--rate-fractions", "0.5")
    assert config("--rate-fractions", "0.5", "--full").plan.rate_fractions == (0.5,)
