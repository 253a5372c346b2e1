"""A batch of sequences split into groups of similar length, each run padded to its own longest.

One forward pass pads every row to the batch's longest sequence, so one long text among short ones
makes each short row cost as much as the long one (256 tokens instead of 16: 16 times the work).
Running the rows in groups by padded width costs rows x width per group plus a fixed cost per pass;
`length_groups` picks the split with the least total (an exact search over the batch's distinct
widths, of which there are at most max_length / pad_bucket), so a batch of like lengths stays one
pass and a mixed one pays for its real tokens, never more than one pass per distinct width.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence


def padded(length: int, bucket: int) -> int:
    """A sequence's width once padded up to a multiple of `bucket` (at least one bucket)."""
    return max(1, -(-length // bucket)) * bucket


def length_groups(lengths: Sequence[int], bucket: int, pass_cost: int) -> list[tuple[list[int], int]]:
    """Rows (by index) in groups, each with the width it runs at, least total cost first found:
    cost = sum over groups of (rows x width) + pass_cost per group, in padded tokens."""
    widths = [padded(n, bucket) for n in lengths]
    classes = sorted(set(widths))
    count = Counter(widths)
    rows_below = [0]
    for width in classes:
        rows_below.append(rows_below[-1] + count[width])
    # best[j]: the least cost of the rows of the j narrowest widths; start[j]: where its last group starts.
    best, start = [0] + [0] * len(classes), [0] * (len(classes) + 1)
    for j in range(1, len(classes) + 1):
        best[j], start[j] = min((best[i] + pass_cost + (rows_below[j] - rows_below[i]) * classes[j - 1], i)
                                for i in range(j))
    groups, j = [], len(classes)
    while j:
        low, high = classes[start[j]], classes[j - 1]
        groups.append(([row for row, width in enumerate(widths) if low <= width <= high], high))
        j = start[j]
    return groups[::-1]
