"""classifier.normalised works in blocks of ROWS_PER_CALL rows (so that numpy keeps the GIL on the lane's thread):
the result must be the whole-batch formula's, bit for bit, whatever the batch size and however many rows are
mirrored, across block boundaries too."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.inference.classifier import ROWS_PER_CALL, normalised


def _whole_batch(probs: np.ndarray, order: np.ndarray, mirrored: int) -> np.ndarray:
    ordered = probs[:, order]
    if mirrored:
        body = ordered[:-mirrored].copy()
        body[:mirrored] = (body[:mirrored] + ordered[-mirrored:]) * np.float32(0.5)
        ordered = body
    return ordered / np.maximum(ordered.sum(axis=1, keepdims=True), 1e-9)


@pytest.mark.parametrize("faces, mirrored", [(0, 0), (1, 0), (1, 1), (5, 3), (ROWS_PER_CALL, ROWS_PER_CALL),
                                             (ROWS_PER_CALL + 1, 2), (3 * ROWS_PER_CALL + 7, 2 * ROWS_PER_CALL + 5),
                                             (300, 0)])
def test_blocks_give_the_whole_batch_formula(faces: int, mirrored: int) -> None:
    rng = np.random.default_rng(faces)
    probs = rng.dirichlet(np.ones(7), faces + mirrored).astype(np.float32)
    order = np.array([6, 0, 1, 2, 3, 4, 5])
    got = normalised(probs, order, mirrored)
    assert got.shape == (faces, 7) and got.dtype == np.float32
    np.testing.assert_array_equal(got, _whole_batch(probs, order, mirrored))
