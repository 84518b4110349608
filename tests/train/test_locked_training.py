"""A run with a locked image tower (last block trainable) and LoRA on the
text tower: what it trains, what it leaves bitwise alone, and exact resume."""

import jax
import jax.numpy as jnp
import numpy as np
from flax.nnx import traversals
from tiny_runs import small_config

from hyperbolic_vl.training import loop, setup

RANK = 2


def _config():
  return small_config(
    **{
      "model.lock_image": True,
      "model.lock_image_unlocked_blocks": 1,
      "model.lora.rank": RANK,
      "model.lora.alpha": 4.0,
      "model.lora.dropout": 0.1,
      "model.lora.towers": ("text",),
    }
  )


def _flat(tree):
  return {
    "/".join(map(str, path)): value for path, value in traversals.flatten_mapping(tree).items()
  }


def test_locked_and_lora_run_trains_only_what_it_says_and_resumes_exactly(tmp_path, capsys):
  config = _config()
  full = loop.train(config, str(tmp_path / "full"))
  printed = capsys.readouterr().out
  init = _flat(setup.init_state(config, full.objective, full.tokenizer)[1]["params"])
  final = _flat(full.state["params"])

  depth = 1 + max(int(n.split("/")[3]) for n in init if n.startswith("image_tower/encoder/"))
  last_block = f"image_tower/encoder/blocks/{depth - 1}/"
  scalars = {"log_logit_scale", "log_curv", "log_alpha_img", "log_alpha_txt"}
  trainable = {
    name
    for name in init
    if name.startswith((last_block, "image_tower/norm/", "image_proj/"))
    or "lora_" in name
    or name in scalars
  }
  # The text tower's adapters by hand: per block q, k, v, out (D r + r D
  # each), fc1 (D r + r 4D) and fc2 (4D r + r D): 18 D r.
  text_width = init["text_tower/norm/scale"].shape[0]
  text_depth = 1 + max(int(n.split("/")[3]) for n in init if n.startswith("text_tower/encoder/"))
  adapters = sum(init[n].size for n in init if "lora_" in n)
  assert adapters == text_depth * 18 * text_width * RANK
  expected = sum(init[n].size for n in trainable)
  total = sum(v.size for v in init.values())
  assert f"Parameters: {total:,} (trainable {expected:,}," in printed

  # Locked params are bitwise what they were; every trainable one moved.
  for name, value in init.items():
    if name in trainable:
      if name != "log_curv":  # may sit at a clamp bound
        assert float(jnp.max(jnp.abs(final[name] - value))) > 0, name
    else:
      np.testing.assert_array_equal(final[name], value, err_msg=name)

  # The optimizer holds state (AdamW's two moments) for trainable params only.
  # (Its step counters are integers.)
  moments = [
    x for x in jax.tree.leaves(full.state["opt_state"]) if jnp.issubdtype(x.dtype, jnp.floating)
  ]
  assert sum(x.size for x in moments) == 2 * expected

  # Resume with dropout keys and locks equals the uninterrupted run.
  assert loop.train(config, str(tmp_path / "resumed"), stop_at_step=4).step == 4
  resumed = loop.train(config, str(tmp_path / "resumed"))
  diffs = jax.tree.map(
    lambda a, b: float(jnp.max(jnp.abs(a - b))), full.state["params"], resumed.state["params"]
  )
  assert max(jax.tree.leaves(diffs)) == 0.0
