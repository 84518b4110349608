"""The rows each process embeds when evaluation is split across processes."""

import numpy as np
import pytest

from hyperbolic_vl import predictor


@pytest.mark.parametrize(
  ("rows", "processes", "want"),
  [
    # 37 rows on 2 processes: 19 + 18.
    (37, 2, (19, [0, 19], [19, 18])),
    # Fewer rows than processes: the last processes embed only padding.
    (2, 4, (1, [0, 1, 2, 2], [1, 1, 0, 0])),
    (8, 4, (2, [0, 2, 4, 6], [2, 2, 2, 2])),
  ],
)
def test_slices_cover_every_row_once_in_order(rows, processes, want):
  per_process, starts, sizes = predictor.process_slices(rows, processes)
  assert (per_process, starts, sizes) == want
  covered = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, sizes)])
  np.testing.assert_array_equal(covered, np.arange(rows))
