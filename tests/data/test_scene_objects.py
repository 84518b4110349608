"""HCL's object-view augmentation (MoCo-v2) against its formulas, and its switch."""

import colorsys

import numpy as np
import pytest

from hyperbolic_vl.data import coco_boxes, scene_objects

IMAGE = np.random.default_rng(0).integers(0, 256, (12, 10, 3), dtype=np.uint8)


def luma(image):
  """ITU-R 601-2 luma in float64 (PIL's convert("L") rounds it)."""
  return image[..., 0] * 0.299 + image[..., 1] * 0.587 + image[..., 2] * 0.114


def test_brightness_contrast_saturation_match_their_blends():
  x = IMAGE.astype(np.float64)
  grey = np.repeat(luma(x)[..., None], 3, -1)
  cases = [
    (scene_objects.adjust_brightness, 1.3, 1.3 * x),
    (scene_objects.adjust_contrast, 0.7, 0.7 * x + 0.3 * np.mean(luma(x))),
    (scene_objects.adjust_saturation, 0.6, 0.6 * x + 0.4 * grey),
  ]
  for op, factor, expected in cases:
    out = op(IMAGE, factor).astype(np.float64)
    # Luma is rounded to uint8 before the blend (one grey level), then the
    # blend is rounded: at most 1 level apart from the float reference.
    np.testing.assert_allclose(out, np.clip(expected, 0, 255), atol=1.0 + 1e-9)
  np.testing.assert_array_equal(scene_objects.adjust_brightness(IMAGE, 1.0), IMAGE)


def test_hue_rotation_matches_colorsys():
  shift = 0.1
  out = scene_objects.adjust_hue(IMAGE, shift).astype(np.float64)
  for pixel, got in zip(IMAGE.reshape(-1, 3) / 255.0, out.reshape(-1, 3) / 255.0):
    h, s, v = colorsys.rgb_to_hsv(*pixel)
    expected = colorsys.hsv_to_rgb((h + shift) % 1.0, s, v)
    # PIL's HSV is 8-bit per channel: hue steps of 1/255 and rounding of
    # s and v, a few levels in RGB for saturated pixels.
    np.testing.assert_allclose(got, expected, atol=6 / 255)


def test_greyscale_blur_and_flip():
  grey = scene_objects.greyscale(IMAGE)
  assert np.all(grey[..., 0] == grey[..., 1]) and np.all(grey[..., 1] == grey[..., 2])
  np.testing.assert_allclose(grey[..., 0], luma(IMAGE.astype(np.float64)), atol=0.5 + 1e-9)
  blurred = scene_objects.gaussian_blur(IMAGE, 2.0).astype(np.float64)
  assert blurred.std() < IMAGE.std()  # a low-pass filter on noise
  assert abs(blurred.mean() - IMAGE.mean()) < 3.0  # that keeps the mean


def test_moco_v2_augment_is_deterministic_per_generator_and_varied():
  outs = [scene_objects.moco_v2_augment(IMAGE, np.random.default_rng(seed)) for seed in (1, 1, 2)]
  np.testing.assert_array_equal(outs[0], outs[1])
  assert not np.array_equal(outs[0], outs[2])
  assert all(o.shape == IMAGE.shape and o.dtype == np.uint8 for o in outs)


def test_augment_switch_keeps_the_crop_windows_and_augments_every_crop(monkeypatch):
  """As HCL's released loader: all four crops get MoCo-v2's photometric
  augmentation, each drawn independently; the crop windows do not move."""
  provider = coco_boxes.WorldBoxes(0, "train", 20)
  plain = scene_objects.SceneObjectExample(provider, 16, seed=0, augment="none")
  moco = scene_objects.SceneObjectExample(provider, 16, seed=0, augment="moco_v2")
  changed = np.zeros(4, int)
  for position in range(8):
    a, b = plain(position, position), moco(position, position)
    changed += [not np.array_equal(x, y) for x, y in zip(a, b)]
  # p(no jitter, grey, blur or flip) = 0.2 * 0.8 * 0.5 * 0.5 = 0.04 per crop.
  assert np.all(changed >= 4), changed
  # With the photometric step made the identity, the augmented examples are
  # the plain ones: the windows come from the crop stream alone.
  calls = []
  monkeypatch.setattr(scene_objects, "moco_v2_augment", lambda image, rng: calls.append(1) or image)
  for position in range(4):
    for x, y in zip(plain(position, position), moco(position, position)):
      np.testing.assert_array_equal(x, y)
  assert len(calls) == 4 * 4
  with pytest.raises(ValueError, match="augment"):
    scene_objects.SceneObjectExample(provider, 16, seed=0, augment="simclr")
