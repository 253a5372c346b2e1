"""The response-cache benchmark's all-distinct workload: every arm and every point gets the same mix."""

import numpy as np
import pytest

from benchmarks.bench.response_cache import distinct_texts

pytestmark = pytest.mark.unit


def _pool() -> list[str]:
    # Sentences whose length grows by region, as Python's documentation topics do.
    return [f"sentence {i} " + "word " * (5 + i // 50) for i in range(400)]


def test_all_distinct_texts_are_distinct_and_mixed_evenly():
    texts = distinct_texts(_pool(), 40_000, seed=0)
    assert len(set(texts)) == len(texts) == 40_000
    means = [np.mean([len(t) for t in texts[i:i + 2000]]) for i in range(0, len(texts), 2000)]
    # Consecutive blocks (one arm's point, the next arm's) cost the same per request within 3%.
    assert max(means) / min(means) < 1.03


def test_too_few_sentences_for_the_count_is_refused():
    with pytest.raises(SystemExit, match="lower --distinct"):
        distinct_texts(["a", "b", "c"], 10, seed=0)
