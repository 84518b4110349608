"""Recall with several captions per image on a hand-built ranking."""

import numpy as np

from hyperbolic_vl.evaluators.metrics import recall


def test_multi_caption_recall_on_a_known_ranking():
  # 3 images, 2 captions each (captions 2i, 2i+1 belong to image i).
  caption_image = np.array([0, 0, 1, 1, 2, 2])
  scores = np.array(
    [
      # image 0: its caption 1 ranks first -> hit at 1.
      [0.1, 0.9, 0.2, 0.3, 0.4, 0.5],
      # image 1: best own caption (3) ranks third -> hit at 5, not at 1.
      [0.9, 0.1, 0.2, 0.7, 0.8, 0.0],
      # image 2: own captions rank 5th and 6th -> hit at 5, not at 3.
      [0.9, 0.8, 0.7, 0.6, 0.1, 0.0],
    ]
  )
  figures = recall.image_caption_figures(scores, caption_image, ks=(1, 3, 5))
  assert figures["i2t_recall@1"] == 1 / 3
  assert figures["i2t_recall@3"] == 2 / 3
  assert figures["i2t_recall@5"] == 1.0
  # text->image, per caption column: the argmax image vs its own image.
  # caption 0: scores (.1,.9,.9) -> image 1 first (stable tie -> 1): own 0 ranks 3rd.
  # caption 1: (.9,.1,.8) -> image 0: hit. caption 2: (.2,.2,.7) -> 2 first,
  # then 0, then 1 (own): 3rd. caption 3: (.3,.7,.6) -> 1: hit.
  # caption 4: (.4,.8,.1) -> own 2 ranks 3rd. caption 5: (.5,0,0) -> own 2 ranks 3rd
  # (ties between images 1 and 2 resolve to the lower index).
  assert figures["t2i_recall@1"] == 2 / 6
  assert figures["t2i_recall@3"] == 1.0
