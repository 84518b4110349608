"""Training from converted releases: Radial Embeddings fine-tuning of a
converted OpenAI-layout CLIP, and HMID-Net distilling from a converted
open_clip teacher of another embedding width.

The references are test_interop's 2-layer open_clip models with random
non-trivial weights, converted by the converter the command line uses; the
runs go through `loop.train_and_evaluate`, the function
`python -m hyperbolic_vl.main` calls. Skipped without the `interop` extra.
"""

import csv
import pathlib

import jax
import numpy as np
import pytest
from paths import HIERARCAPS_MINI

torch = pytest.importorskip("torch")
pytest.importorskip("open_clip")

import test_interop  # noqa: E402

from configs import hmid as hmid_config  # noqa: E402
from configs import radial as radial_config  # noqa: E402
from hyperbolic_vl import objectives as objectives_lib  # noqa: E402
from hyperbolic_vl.data import tokenizer as tokenizer_lib  # noqa: E402
from hyperbolic_vl.interop import workdir as interop_workdir  # noqa: E402
from hyperbolic_vl.runs import loading  # noqa: E402
from hyperbolic_vl.training import loop, optimizer, setup  # noqa: E402

FIXTURE = HIERARCAPS_MINI
STEPS = 3


def flat(params) -> dict[str, np.ndarray]:
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  return {optimizer.path_str(path): np.asarray(leaf) for path, leaf in leaves}


def converted_open_clip(tmp_path, embed_dim=32) -> pathlib.Path:
  """A 2-layer open_clip CLIP (QuickGELU) saved as a release and converted."""
  torch.manual_seed(0)
  reference = test_interop.open_clip_reference(embed_dim=embed_dim)
  checkpoint = tmp_path / "open_clip.pt"
  torch.save(reference.state_dict(), checkpoint)
  out = tmp_path / f"converted_{embed_dim}"
  config = test_interop.openai_mu_config(embed_dim=embed_dim)
  with config.unlocked():
    # The fine-tuning tests compare training steps exactly: float32 towers.
    config.model.dtype = "float32"
  interop_workdir.convert_checkpoint("open_clip", str(checkpoint), config, str(out))
  return out


def hierarcaps_train_csv(tmp_path) -> pathlib.Path:
  """HierarCaps' train format from the fixture: each row's hierarchy as the
  positive and the next row's as the negative (8 rows: one batch of 8)."""
  with open(FIXTURE / "hierarcaps_mini.csv", newline="") as f:
    hierarchies = [row["captions"] for row in csv.DictReader(f)]
  hierarchies = (hierarchies * 2)[:8]
  path = tmp_path / "train.csv"
  with open(path, "w", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["positive", "negative", "image_url"])
    for i, positive in enumerate(hierarchies):
      negative = hierarchies[(i + 1) % len(hierarchies)]
      writer.writerow([positive, negative, f"http://images.cocodataset.org/x/{i}.jpg"])
  return path


def shrink(config, context=test_interop.CONTEXT, **model):
  """A paper-setting config at the 2-layer reference's sizes, one device."""
  with config.unlocked():
    config.input.image_size = test_interop.IMAGE_SIZE
    config.input.tokenizer.context_length = context
    config.model.update(dict(dtype="float32", **model))
    config.num_devices = 1
    config.total_steps = STEPS
    config.ckpt_steps = STEPS
    config.log_training_steps = 1
  return config


def test_radial_fine_tunes_the_text_tower_of_a_converted_open_clip(tmp_path):
  converted = converted_open_clip(tmp_path)
  config = shrink(
    radial_config.get_config("openai_vit_b32"),
    image_variant="mu/8",
    image_num_heads=2,
    text_variant="mu",
    embed_dim=32,
  )
  with config.unlocked():
    config.init_from = str(converted)
    config.input.data.path = str(hierarcaps_train_csv(tmp_path))
  # The paper's setting is what runs: batch 8, AdamW lr 1e-7 constant.
  assert config.input.batch_size == 8 and config.optim.lr == 1e-7
  assert config.optim.schedule == "constant"
  _, _, converted_params, _ = loading.restore_run_params(str(converted))
  converted_params = flat(converted_params)

  # Step 0 is the converted model, every tensor bit for bit.
  objective = objectives_lib.get(config.objective)
  tokenizer = tokenizer_lib.get_tokenizer(config.input.tokenizer)
  _, state, *_ = setup.init_state(config, objective, tokenizer)
  start = flat(state["params"])
  assert start.keys() == converted_params.keys()
  for name, value in converted_params.items():
    np.testing.assert_array_equal(start[name], value, err_msg=name)

  run = tmp_path / "radial"
  loop.train_and_evaluate(config, str(run))
  _, _, final, _ = loading.restore_run_params(str(run))
  final = flat(final)
  changed = {n for n, v in final.items() if not np.array_equal(v, converted_params[n])}
  # Only the text side moves; the image tower and the logit scale are frozen
  # bit for bit.
  assert {n.split("/")[0] for n in changed} == {"text_tower", "text_proj"}, sorted(changed)[:5]
  assert all(objective.trainable(tuple(n.split("/"))) for n in changed)
  # Every text-tower tensor moves (AdamW moves each weight by ~lr per step).
  text_names = [n for n in final if n.startswith(("text_tower/", "text_proj/"))]
  assert set(text_names) == changed
  largest_step = max(np.max(np.abs(final[n] - converted_params[n])) for n in changed)
  # Adam's per-step update is at most ~3.2 lr ((1 - b1) / sqrt(1 - b2));
  # anything bigger would mean the lr or schedule is not the paper's.
  assert 0 < largest_step <= STEPS * 3.2 * 1e-7 * 1.01, largest_step


# ---------------------------------------------------------------------------
# HMID-Net with a converted teacher of another width.
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("teacher_dim,student_dim", [(48, 32), (16, 32)])
def test_width_map_is_an_isometry_or_a_norm_keeping_projection(teacher_dim, student_dim):
  from hyperbolic_vl.objectives import hmid as hmid_lib

  m = hmid_lib.width_map(teacher_dim, student_dim, seed=0).astype(np.float64)
  assert m.shape == (teacher_dim, student_dim)
  np.testing.assert_array_equal(m, hmid_lib.width_map(teacher_dim, student_dim, seed=0))
  if teacher_dim < student_dim:
    # t -> t m keeps every inner product: m m^T = I (float32 entries, so
    # 1e-6 covers their rounding).
    np.testing.assert_allclose(m @ m.T, np.eye(teacher_dim), atol=1e-6)
  else:
    # Orthonormal columns scaled by sqrt(E_T / E_S): the mean squared norm of
    # t m over isotropic t is |t|^2, i.e. trace(m m^T) = E_T.
    scale = teacher_dim / student_dim
    np.testing.assert_allclose(m.T @ m, scale * np.eye(student_dim), atol=1e-6 * scale)
    np.testing.assert_allclose(np.trace(m @ m.T), teacher_dim, rtol=1e-6)


def hmid_student_config(teacher_workdir, **objective):
  config = shrink(hmid_config.get_config(), image_variant="mu/8", embed_dim=32)
  with config.unlocked():
    config.input.tokenizer.update(dict(name="clip_bpe", vocab_size=49408))
    config.input.batch_size = 8
    config.evals.world.num_examples = 16
    config.evals.world.batch_size = 16
    config.objective.teacher_workdir = str(teacher_workdir)
    config.objective.update(objective)
  return config


def test_hmid_distils_from_a_converted_open_clip_teacher_of_another_width(tmp_path):
  from hyperbolic_vl.geometry import lorentz
  from hyperbolic_vl.objectives import hmid as hmid_lib

  teacher_dir = converted_open_clip(tmp_path, embed_dim=48)  # student: 32
  config = hmid_student_config(teacher_dir)
  objective = objectives_lib.get(config.objective)
  tokenizer = tokenizer_lib.get_tokenizer(config.input.tokenizer)
  model_def, state, _, _, context, _ = setup.init_state(config, objective, tokenizer)
  width_map = np.asarray(state["aux"]["teacher_width_map"])
  np.testing.assert_array_equal(width_map, hmid_lib.width_map(48, 32, seed=0))

  # The teacher targets are the PyTorch reference's CLIP features, mapped to
  # the student's width, L2-normalised and lifted with the student's curvature.
  torch.manual_seed(0)
  reference = test_interop.open_clip_reference(embed_dim=48)
  pixels = test_interop.images("generated")
  tokens = np.asarray(tokenizer.encode(test_interop.CAPTIONS), np.int32)
  with torch.no_grad():
    ref_text = test_interop.NormalisedOpenClip(reference).encode_text(
      torch.from_numpy(tokens).long()
    )
  student = model_def.merge(state["params"])
  teacher_embeddings = jax.jit(
    lambda aux, batch, params: objective.teacher_embeddings(
      aux, batch, model_def.merge(params), context.teacher.model_def
    )
  )
  _, text = teacher_embeddings(state["aux"], {"image": pixels, "tokens": tokens}, state["params"])
  mapped = ref_text.numpy().astype(np.float64) @ width_map
  mapped /= np.linalg.norm(mapped, axis=-1, keepdims=True)
  expected = lorentz.exp_map0(mapped, float(student.curv()))
  # The converted teacher matches PyTorch to 1e-4 relative (test_interop);
  # the unit-norm map and lift keep that order.
  np.testing.assert_allclose(text, expected, rtol=0, atol=1e-4 * np.max(np.abs(expected)))

  # loop.train is train_and_evaluate without the final world evaluation
  # (which would double this test's time and is tested elsewhere).
  run = tmp_path / "hmid"
  result = loop.train(config, str(run))
  assert result.step == STEPS
  metrics = (run / "metrics.jsonl").read_text()
  assert "train/loss/distillation" in metrics
  _, _, teacher_params, _ = loading.restore_run_params(str(teacher_dir))
  # The teacher is frozen: bit for bit the converted weights after training.
  trained_teacher = flat(result.state["aux"]["teacher_params"])
  for name, value in flat(teacher_params).items():
    np.testing.assert_array_equal(trained_teacher[name], value, err_msg=name)
  # The student did learn (every step was finite and moved its params).
  moved = flat(result.state["params"])
  assert any(not np.array_equal(moved[n], v) for n, v in flat(state["params"]).items())


def test_hmid_refuses_another_width_when_the_map_is_off(tmp_path):
  teacher_dir = converted_open_clip(tmp_path, embed_dim=48)
  config = hmid_student_config(teacher_dir, teacher_width_map="")
  objective = objectives_lib.get(config.objective)
  tokenizer = tokenizer_lib.get_tokenizer(config.input.tokenizer)
  with pytest.raises(ValueError, match="teacher embed_dim 48 != student embed_dim 32"):
    setup.init_state(config, objective, tokenizer)
