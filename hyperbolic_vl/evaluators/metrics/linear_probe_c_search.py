"""Linear probe on frozen image features (MERU's protocol).

Multinomial logistic regression; the inverse regularisation strength C is
chosen on a validation split from a log-spaced grid, then the probe is
refit on train+validation and scored on the test split (top-1).

Solver: scikit-learn's L-BFGS logistic regression, a well-kept, exact
solver of this convex problem on CPU; probe features are small (N x D with
D <= 1024), so a device solver would buy nothing. scikit-learn is a core
dependency so the probe and its test work in every install.
"""

from __future__ import annotations

import numpy as np

DEFAULT_C_GRID = tuple(float(c) for c in np.logspace(-6, 6, 13))


def _fit(features, labels, c: float, max_iter: int):
  # Imported here: scikit-learn sets process-wide variables (KMP_*) when it
  # loads, which importing the evaluators must not.
  from sklearn.linear_model import LogisticRegression  # pylint: disable=g-import-not-at-top

  return LogisticRegression(C=c, max_iter=max_iter).fit(features, labels)


def linear_probe(
  train: tuple[np.ndarray, np.ndarray],
  val: tuple[np.ndarray, np.ndarray],
  test: tuple[np.ndarray, np.ndarray],
  c_grid=DEFAULT_C_GRID,
  max_iter: int = 1000,
) -> dict[str, float]:
  """(features, labels) triples -> {"top1": test accuracy, "C": chosen C}.

  Ties in validation accuracy go to the smallest C (strongest regulariser).
  """
  (train_x, train_y), (val_x, val_y), (test_x, test_y) = train, val, test
  best_c, best_acc = None, -1.0
  for c in c_grid:
    acc = float(np.mean(_fit(train_x, train_y, c, max_iter).predict(val_x) == val_y))
    if acc > best_acc:
      best_c, best_acc = c, acc
  probe = _fit(np.concatenate([train_x, val_x]), np.concatenate([train_y, val_y]), best_c, max_iter)
  return {"top1": float(np.mean(probe.predict(test_x) == test_y)), "C": float(best_c)}
