"""The phyclip and uncha suites: MERU's table plus each paper's own
benchmarks, each entry a complete evaluator of the right type and data."""

from hyperbolic_vl.evaluators import command_entries
from hyperbolic_vl.evaluators.datasets import benchmarks

COMMON = dict(batch_size=32, num_examples=None)


def test_phyclip_suite_adds_hierarchy_sugarcrepe_and_vl_checklist():
  evals = command_entries.phyclip_suite(
    "/tfds", "f.csv", "/flickr", "/sugar/data", "/coco/val2017", "/vl", "/vl_images", **COMMON
  )
  meru = command_entries.meru_suite("/tfds", "f.csv", "/flickr", **COMMON)
  assert set(evals) == set(meru) | {"imagenet_hierarchy", "sugarcrepe", "vl_checklist"}
  assert len(meru) == len(benchmarks.MERU_ZERO_SHOT_SUITE) + 2
  assert evals["sugarcrepe"].type == "sugarcrepe"
  assert (evals["sugarcrepe"].path, evals["sugarcrepe"].image_root) == (
    "/sugar/data",
    "/coco/val2017",
  )
  assert (evals["vl_checklist"].path, evals["vl_checklist"].image_root) == ("/vl", "/vl_images")
  assert evals["vl_checklist"].normalization == "release"  # the released evaluation's default
  assert evals["imagenet_hierarchy"].type == "hierarchical_classification"
  assert evals["imagenet_hierarchy"].data_dir == "/tfds"


def test_uncha_suite_adds_multilabel_map_on_voc_and_coco():
  evals = command_entries.uncha_suite(
    "/tfds", "", "", "/voc/VOC2007", "/coco/instances_val2014.json", "/coco/val2014", **COMMON
  )
  assert evals["voc2007_multilabel"].type == "multilabel"
  assert (evals["voc2007_multilabel"].dataset, evals["voc2007_multilabel"].path) == (
    "voc2007",
    "/voc/VOC2007",
  )
  coco = evals["coco_multilabel"]
  assert (coco.dataset, coco.path, coco.image_root) == (
    "coco",
    "/coco/instances_val2014.json",
    "/coco/val2014",
  )
  assert "imagenet_hierarchy" in evals and "coco" in evals and "imagenet" in evals
