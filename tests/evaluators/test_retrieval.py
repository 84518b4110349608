"""Retrieval figures on hand-built score matrices."""

import numpy as np

from hyperbolic_vl.evaluators.metrics import recall


def test_recall_at_k_hand_computed():
  scores = np.array(
    [
      [0.9, 0.1, 0.5],  # relevant item 0 ranked 1st
      [0.9, 0.1, 0.5],  # relevant item 1 ranked 3rd
      [0.2, 0.9, 0.5],
    ]
  )  # relevant item 2 ranked 2nd
  relevant = np.eye(3, dtype=bool)
  assert recall.recall_at_k(scores, relevant, (1, 2, 3)) == {1: 1 / 3, 2: 2 / 3, 3: 1.0}


def test_recall_counts_any_relevant_item_and_ties_are_stable():
  scores = np.array([[0.5, 0.5, 0.1]])
  assert recall.recall_at_k(scores, np.array([[False, True, False]]), (1,))[1] == 0.0
  assert recall.recall_at_k(scores, np.array([[True, True, False]]), (1,))[1] == 1.0


def test_caption_relevance_merges_duplicates():
  captions = np.array([[1, 2], [3, 4], [1, 2], [5, 6]])
  first, relevant = recall.caption_relevance(captions)
  assert len(first) == 3
  np.testing.assert_array_equal(relevant.sum(axis=1), [1, 1, 1, 1])
  # Images 0 and 2 share one gallery caption; recall treats them alike.
  np.testing.assert_array_equal(relevant[0], relevant[2])


def test_chance_recall_matches_closed_form_and_simulation():
  relevant = np.zeros((4, 10), bool)
  relevant[np.arange(4), np.arange(4)] = True
  assert np.isclose(recall.chance_recall_at_k(relevant, 5), 0.5)
  rng = np.random.default_rng(0)
  simulated = np.mean(
    [recall.recall_at_k(rng.normal(size=(4, 10)), relevant, (5,))[5] for _ in range(2000)]
  )
  assert abs(simulated - 0.5) < 0.02


def test_accuracy():
  assert recall.accuracy(np.array([[0.1, 0.9], [0.8, 0.2]]), np.array([1, 1])) == 0.5
