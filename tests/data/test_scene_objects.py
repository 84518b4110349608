"""HCL's object-view augmentation (MoCo-v2) against its formulas, and its switch."""

import colorsys

import numpy as np
import pytest

from hyperbolic_vl import errors
from hyperbolic_vl.data import scene_objects
from hyperbolic_vl.data.readers import object_boxes as coco_boxes

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


# ---------------------------------------------------------------------------
# The released sampling, on hand-made boxes.
# ---------------------------------------------------------------------------
class ScriptedRng:
  """Answers `integers` and `permutation` from a script and records what was
  asked, so each released rule is checked on exact bounds and picks."""

  def __init__(self, integers=(), permutation=None):
    self.values, self.order, self.asked = list(integers), permutation, []

  def integers(self, low, high=None):
    self.asked.append((low, high))
    return self.values.pop(0)

  def permutation(self, n):
    self.asked.append(("permutation", n))
    return np.asarray(self.order)


def test_box_filter_keeps_exactly_56_by_56():
  """Released: a box is dropped when its pixel area is < 56 * 56 (not <=)."""
  boxes = np.array(
    [
      [0, 0, 56, 56],  # 3136 = 56 * 56: kept
      [0, 0, 56, 55],  # 3080: dropped
      [10, 10, 74, 59],  # 64 x 49 = 3136: kept
      [10, 10, 73, 59],  # 63 x 49 = 3087: dropped
    ]
  )
  np.testing.assert_array_equal(scene_objects.kept_boxes(boxes, 56 * 56), boxes[[0, 2]])
  # With no area floor an empty box still never becomes the object.
  empty = np.array([[5, 5, 5, 40], [0, 0, 1, 1]])
  np.testing.assert_array_equal(scene_objects.kept_boxes(empty, 0), empty[[1]])


def test_small_object_window_widens_by_the_released_margins():
  # 640 x 480 image, a 50 x 60 px box: margins 256 - 50 = 206 and 256 - 60 = 196.
  rng = ScriptedRng(integers=[30, 300, 150, 400])
  window = scene_objects.view_window(rng, (100, 200, 150, 260), 640, 480)
  np.testing.assert_array_equal(window, [30, 150, 300, 400])
  assert rng.asked == [
    (0, 101),  # left in [max(0, 100 - 206), 100]
    (150, 357),  # right in [150, min(640, 150 + 206)]
    (4, 201),  # top in [200 - 196, 200]
    (260, 467),  # bottom in [260, min(480, 260 + 206)]: the width's margin, as released
  ]
  # Near the border the window stops at the image.
  rng = ScriptedRng(integers=[0, 640, 0, 480])
  scene_objects.view_window(rng, (600, 440, 640, 480), 640, 480)
  assert rng.asked == [(384, 601), (640, 641), (224, 441), (480, 481)]


def test_large_object_is_its_own_view_window():
  # 256 x 256 = 65536 px is not under 256^2: the box itself, no draw.
  rng = ScriptedRng()
  window = scene_objects.view_window(rng, (10, 20, 266, 276), 640, 480)
  np.testing.assert_array_equal(window, [10, 20, 266, 276])
  assert rng.asked == []
  # One pixel less and it widens (margins 1 and 0).
  rng = ScriptedRng(integers=[9, 266, 20, 277])
  np.testing.assert_array_equal(
    scene_objects.view_window(rng, (10, 20, 265, 276), 640, 480), [9, 20, 266, 277]
  )
  assert rng.asked == [(9, 11), (265, 267), (20, 21), (276, 278)]


BOXES = np.array([[0, 0, 60, 60], [100, 50, 200, 160], [300, 10, 360, 90], [20, 200, 90, 300]])


def test_scene_union_draws_k_boxes_and_adds_the_object():
  # n = 4: k in [2, max(min(4, 6), 3) - 1] = [2, 3]; k = 2 of the permutation
  # [3, 1, 0, 2] are boxes 3 and 1; the object (2) is added.
  rng = ScriptedRng(integers=[2], permutation=[3, 1, 0, 2])
  region = scene_objects.scene_union(rng, BOXES, obj=2)
  assert rng.asked == [(2, 4), ("permutation", 4)]
  np.testing.assert_array_equal(region, [20, 10, 360, 300])  # union of boxes 1, 2, 3
  # The object among the drawn boxes: nothing added (boxes 1 and 2 only).
  rng = ScriptedRng(integers=[2], permutation=[1, 2, 0, 3])
  np.testing.assert_array_equal(scene_objects.scene_union(rng, BOXES, obj=2), [100, 10, 360, 160])


@pytest.mark.parametrize("n, high", [(2, 3), (3, 3), (5, 5), (6, 6), (9, 6)])
def test_scene_union_count_range(n, high):
  """randint(2, max(min(n, 6), 3)): 2 boxes for n <= 3, at most 5 drawn."""
  rng = ScriptedRng(integers=[2], permutation=list(range(n)))
  scene_objects.scene_union(rng, np.tile(BOXES[:1], (n, 1)), obj=0)
  assert rng.asked[0] == (2, high)


class HandMadeScenes:
  """Pixel boxes per scene of a 640 x 480 image; records what is opened and
  every window rendered."""

  def __init__(self, scenes):
    self.scenes, self.opened, self.windows = scenes, [], []

  def __len__(self):
    return len(self.scenes)

  def pixel_boxes(self, index):
    return np.asarray(self.scenes[index], np.int64).reshape(-1, 4)

  def pixel_size(self, index):
    return 640, 480

  def open(self, index):
    self.opened.append(index)
    provider = self

    class Scene:
      def render_pixels(self, box, size):
        provider.windows.append(np.asarray(box, np.float64))
        return np.zeros((size, size, 3), np.uint8)

    return Scene()


def test_scenes_without_two_kept_boxes_are_replaced():
  scenes = [
    [[0, 0, 100, 100]],  # one box: replaced
    [[0, 0, 100, 100], [200, 200, 240, 240]],  # the second is 40 x 40: one kept, replaced
    BOXES.tolist(),  # four boxes >= 56 x 56
  ]
  provider = HandMadeScenes(scenes)
  example = scene_objects.SceneObjectExample(provider, 8, seed=0)
  for position in range(6):
    example(position, position % 2)  # always asked for scene 0 or 1
  assert provider.opened == [2] * 6
  for view1, view2, region, box in np.reshape(provider.windows, (6, 4, 4)):
    assert any(np.array_equal(box, b) for b in BOXES)  # the object is one box exactly
    # The scene region is exactly the union of >= 2 boxes, the object's among them.
    inside = np.array(
      [b for b in BOXES if np.all(b[:2] >= region[:2]) and np.all(b[2:] <= region[2:])]
    )
    assert len(inside) >= 2 and any(np.array_equal(b, box) for b in inside)
    np.testing.assert_array_equal(region, [*inside[:, :2].min(0), *inside[:, 2:].max(0)])
    # Each view lies in the object's widened window (margins 256 - side; the
    # bottom takes the width's), inside the image.
    margin_x, margin_y = max(0, 256 - (box[2] - box[0])), max(0, 256 - (box[3] - box[1]))
    outer = [
      max(0, box[0] - margin_x),
      max(0, box[1] - margin_y),
      min(640, box[2] + margin_x),
      min(480, box[3] + margin_x),
    ]
    for view in (view1, view2):
      assert np.all(view[:2] >= np.asarray(outer[:2]) - 1e-9), (view, outer)
      assert np.all(view[2:] <= np.asarray(outer[2:]) + 1e-9), (view, outer)
  with pytest.raises(errors.DataError, match="2 boxes"):
    scene_objects.SceneObjectExample(HandMadeScenes(scenes[:2]), 8, seed=0)(0, 0)


def test_world_pixel_boxes_truncate_as_released():
  provider = coco_boxes.WorldBoxes(0, "train", 5, pixels=512)
  for index in range(5):
    expected = np.floor(provider.boxes(index).astype(np.float64) * 512)
    np.testing.assert_array_equal(provider.pixel_boxes(index), expected)
  assert provider.pixel_size(0) == (512, 512)
