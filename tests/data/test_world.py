"""The synthetic world: determinism, rendering, captions, labels, prompts."""

import dataclasses
import re

import numpy as np
import pytest

from hyperbolic_vl.data import synthetic_world as world

NUM_SCENES = 200


@pytest.fixture(scope="module")
def scenes():
  return [world.sample_scene(0, "train", index) for index in range(NUM_SCENES)]


def _downsample(image: np.ndarray, factor: int) -> np.ndarray:
  size = image.shape[0] // factor
  return image.astype(np.float64).reshape(size, factor, size, factor, 3).mean(axis=(1, 3))


def test_vocabulary_is_consistent():
  assert len(world.SHAPES) == 6 and len(set(world.SHAPES)) == 6
  assert set(world.FAMILY_OF_SHAPE) == set(world.SHAPES)
  assert len(world.COLORS) == 6 and len(set(world.COLOR_RGB.values())) == 6
  assert world.CLASS_NAMES["count"] == ("one", "two", "three", "four")
  assert set(world.CLASS_NAMES) == {"shape", "color", "count", "background", "size"}


def test_sample_scene_is_deterministic():
  for index in (0, 1, 17):
    a = world.sample_scene(3, "train", index)
    b = world.sample_scene(3, "train", index)
    assert a == b
    np.testing.assert_array_equal(world.render(a, 32), world.render(b, 32))
    assert world.caption_tiers(a) == world.caption_tiers(b)


def test_splits_and_seeds_are_different_streams():
  for index in range(20):
    train = world.sample_scene(0, "train", index)
    assert train != world.sample_scene(0, "test", index)
    assert train != world.sample_scene(0, "validation", index)
    assert train != world.sample_scene(1, "train", index)
  with pytest.raises(ValueError, match="split"):
    world.sample_scene(0, "dev", 0)


def test_scene_invariants(scenes):
  overlapping_pairs = 0
  for scene in scenes:
    assert 1 <= scene.count <= world.MAX_OBJECTS
    main = scene.main
    assert main.radius >= 0.15, "main object must stay recognisable at 32 px"
    assert all(
      obj.radius < main.radius for i, obj in enumerate(scene.objects) if i != scene.main_index
    )
    boxes = world.object_boxes(scene)
    assert boxes.shape == (scene.count, 4) and boxes.dtype == np.float32
    assert (boxes >= -1e-6).all() and (boxes <= 1 + 1e-6).all()
    for i in range(scene.count):
      for j in range(i + 1, scene.count):
        a, b = scene.objects[i], scene.objects[j]
        overlapping_pairs += world._box_gap(a.center, a.radius, b.center, b.radius) < 0
  assert overlapping_pairs <= 0.02 * NUM_SCENES


def test_main_index_is_first_largest():
  obj = world.SceneObject("circle", "red", "small", (0.3, 0.3), 0.2)
  twin = dataclasses.replace(obj, center=(0.7, 0.7), color="blue")
  scene = world.Scene(objects=(obj, twin), background="black")
  assert scene.main_index == 0


@pytest.mark.parametrize("size", [16, 32, 64])
def test_render_shape_and_dtype(scenes, size):
  image = world.render(scenes[0], size)
  assert image.shape == (size, size, 3) and image.dtype == np.uint8


def test_render_is_consistent_across_resolutions(scenes):
  for scene in scenes[:20]:
    image_64 = world.render(scene, 64)
    image_32 = world.render(scene, 32).astype(np.float64)
    image_16 = world.render(scene, 16).astype(np.float64)
    # Same mean colour at every resolution (anti-aliased coverage) ...
    np.testing.assert_allclose(image_64.mean(axis=(0, 1)), image_32.mean(axis=(0, 1)), atol=3)
    np.testing.assert_allclose(image_32.mean(axis=(0, 1)), image_16.mean(axis=(0, 1)), atol=4)
    # ... and, pixel by pixel, 64 px averaged 2x2 looks like 32 px.
    assert np.abs(_downsample(image_64, 2) - image_32).mean() < 2


def test_full_crop_equals_no_crop(scenes):
  for scene in scenes[:10]:
    np.testing.assert_array_equal(
      world.render(scene, 32, crop=(0.0, 0.0, 1.0, 1.0)), world.render(scene, 32)
    )


def test_crop_renders_the_window_at_full_resolution(scenes):
  for scene in scenes[:10]:
    full = world.render(scene, 128).astype(int)
    top_left = world.render(scene, 64, crop=(0.0, 0.0, 0.5, 0.5)).astype(int)
    bottom_right = world.render(scene, 64, crop=(0.5, 0.5, 1.0, 1.0)).astype(int)
    assert np.abs(top_left - full[:64, :64]).max() <= 1
    assert np.abs(bottom_right - full[64:, 64:]).max() <= 1
  with pytest.raises(ValueError, match="crop"):
    world.render(scenes[0], 8, crop=(0.5, 0.0, 0.4, 1.0))


def _pixels_near(image: np.ndarray, rgb, tolerance: float = 40.0) -> int:
  distance = np.linalg.norm(image.astype(np.float64) - np.asarray(rgb), axis=-1)
  return int((distance < tolerance).sum())


def test_main_object_colour_is_visible(scenes):
  for scene in scenes[:50]:
    main = scene.main
    rgb = world.COLOR_RGB[main.color]
    assert _pixels_near(world.render(scene, 64), rgb) >= 100
    # The object's own region is dominated by its colour (the ring's hole and
    # the triangle's empty corners are the least covered shapes).
    region = world.render_region(scene, main.box, 32)
    assert _pixels_near(region, rgb) >= 0.3 * 32 * 32


def test_caption_tiers_are_entailed_by_construction(scenes):
  for scene in scenes:
    tiers = world.caption_tiers(scene)
    main = scene.main
    assert len(tiers) == 4 and all(t == t.lower() for t in tiers)
    assert tiers[0].split()[-2] == main.family
    assert tiers[1].split()[-1] == main.shape
    assert world.FAMILY_OF_SHAPE[tiers[1].split()[-1]] == tiers[0].split()[-2]
    assert tiers[1].split()[-1] in tiers[2].split()
    color_shape = " ".join(tiers[2].split()[1:])
    assert color_shape in tiers[3]
    assert f"{main.size} {color_shape}" in tiers[3]
    assert f"on a {scene.background} background" in tiers[3]


def test_articles_follow_the_next_word():
  scene = world.Scene(
    objects=(world.SceneObject("circle", "orange", "large", (0.5, 0.5), 0.3),), background="gray"
  )
  tiers = world.caption_tiers(scene)
  assert tiers[2] == "an orange circle"
  assert tiers[3] == "a large orange circle alone on a gray background"


_T4_PATTERN = re.compile(
  r"^an? (\w+) (\w+) (\w+)(?: alone| and (\w+) other shapes?) on an? (\w+) background$"
)


def _parse_t4(caption: str) -> tuple:
  """(size, colour, shape, number of other shapes, background) of a T4 caption."""
  match = _T4_PATTERN.match(caption)
  assert match, caption
  return match.groups()


def test_negatives_contradict_each_tier(scenes):
  rng = np.random.default_rng(0)
  for scene in scenes:
    positives = world.caption_tiers(scene)
    negatives = world.negative_tiers(scene, rng)
    assert len(negatives) == 4
    for positive, negative in zip(positives, negatives):
      assert positive != negative
    assert negatives[0].split()[-2] != scene.main.family
    assert negatives[1].split()[-1] != scene.main.shape
    assert negatives[2].split()[-1] == scene.main.shape
    assert negatives[2].split()[-2] != scene.main.color
    # T4: same template, exactly one attribute changed, the shape kept.
    positive_attributes = _parse_t4(positives[3])
    negative_attributes = _parse_t4(negatives[3])
    changed = [a != b for a, b in zip(positive_attributes, negative_attributes)]
    assert sum(changed) == 1 and positive_attributes[2] == negative_attributes[2]


def test_labels_agree_with_captions(scenes):
  for scene in scenes:
    labels = world.labels(scene)
    assert set(labels) == set(world.CLASS_NAMES)
    t4 = world.caption_tiers(scene)[3]
    for kind in ("shape", "color", "size", "background"):
      assert world.CLASS_NAMES[kind][labels[kind]] in t4.split()
    count = labels["count"] + 1
    assert count == scene.count
    if count == 1:
      assert "alone" in t4
    else:
      assert f"and {world.COUNT_WORDS[count - 2]} other" in t4


def test_object_boxes_labels_and_union(scenes):
  for scene in scenes[:30]:
    boxes = world.object_boxes(scene)
    labels = world.object_labels(scene)
    assert labels.dtype == np.int32 and labels.shape == (scene.count,)
    assert labels[scene.main_index] == world.labels(scene)["shape"]
    union = world.union_box(boxes)
    assert union.shape == (4,)
    assert (union[:2] <= boxes[:, :2]).all() and (union[2:] >= boxes[:, 2:]).all()
    assert world.render_region(scene, union, 24).shape == (24, 24, 3)


def test_zero_shot_prompts_use_the_caption_grammar():
  corpus = set(world.caption_corpus())
  for kind, class_names in list(world.CLASS_NAMES.items()) + [("family", world.FAMILIES)]:
    prompts = world.zero_shot_prompts(kind)
    assert len(prompts) == len(class_names)
    for class_name, class_prompts in zip(class_names, prompts):
      assert len(class_prompts) >= 2
      assert all(p in corpus for p in class_prompts)
      if kind != "family":
        assert all(class_name in p.split() for p in class_prompts[:2])
  with pytest.raises(ValueError, match="kind"):
    world.zero_shot_prompts("texture")


def test_caption_corpus_covers_captions_and_negatives(scenes):
  corpus = set(world.caption_corpus())
  rng = np.random.default_rng(0)
  for scene in scenes:
    assert set(world.caption_tiers(scene)) <= corpus
    assert set(world.negative_tiers(scene, rng)) <= corpus
