"""HAC's loss is HyCoCLIP's objective with configs/hac.py's settings: its
value, every logged part and its gradients against a float64 PyTorch
reference written from the release (fdibiton/HAC at 99d6c52), on a random
batch with boxes.

The reference follows `AdaptedCLIP.forward` (hac/models.py:773-853, use_boxes
and both weights > 0): four cross-entropies of -s d_L averaged by 1/4 (box
rows against whole captions / images, :777-807), four entailment hinges with
the inter-modal factor 0.7 and intra-modal 1.2 averaged by 0.5 (:811-845),
then contrastive + 0.2 entailment (:847-853); the Lorentz functions are
hac/lorentz.py's (pairwise_dist :58-81, half_aperture :134-160, oxy_angle
:163-198), eps guards included as an argument.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_fixtures import GivenEmbeddings, boxed_embeddings

from configs import hac as hac_config
from hyperbolic_vl.objectives import hycoclip as hycoclip_lib

torch = pytest.importorskip("torch")
F = torch.nn.functional


def release_pairwise_dist(x, y, curv, eps):
  x_time = torch.sqrt(1 / curv + torch.sum(x**2, dim=-1, keepdim=True))
  y_time = torch.sqrt(1 / curv + torch.sum(y**2, dim=-1, keepdim=True))
  c_xyl = -curv * (x @ y.T - x_time @ y_time.T)
  return torch.acosh(torch.clamp(c_xyl, min=1 + eps)) / curv**0.5


def release_half_aperture(x, curv, eps, min_radius=0.1):
  asin_input = 2 * min_radius / (torch.norm(x, dim=-1) * curv**0.5 + eps)
  return torch.asin(torch.clamp(asin_input, min=-1 + eps, max=1 - eps))


def release_oxy_angle(x, y, curv, eps):
  x_time = torch.sqrt(1 / curv + torch.sum(x**2, dim=-1))
  y_time = torch.sqrt(1 / curv + torch.sum(y**2, dim=-1))
  c_xyl = curv * (torch.sum(x * y, dim=-1) - x_time * y_time)
  numerator = y_time + c_xyl * x_time
  denominator = torch.sqrt(torch.clamp(c_xyl**2 - 1, min=eps))
  acos_input = numerator / (torch.norm(x, dim=-1) * denominator + eps)
  return torch.acos(torch.clamp(acos_input, min=-1 + eps, max=1 - eps))


def release_loss(image, text, box_image, box_text, curv, scale, eps, settings):
  """{our metric name: value} of AdaptedCLIP.forward's loss and its parts."""
  targets = torch.arange(image.shape[0])
  ce = lambda rows, columns: F.cross_entropy(
    scale * -release_pairwise_dist(rows, columns, curv, eps), targets
  )

  def entail(general, specific, factor):
    angle = release_oxy_angle(general, specific, curv, eps)
    aperture = release_half_aperture(general, curv, eps)
    return torch.clamp(angle - factor * aperture, min=0).mean()

  inter, intra = settings.inter_modal_aperture, settings.intra_modal_aperture
  terms = {
    "loss/contrastive/image": ce(image, text),
    "loss/contrastive/text": ce(text, image),
    "loss/contrastive/box_image": ce(box_image, text),
    "loss/contrastive/box_text": ce(box_text, image),
    "loss/entailment/text_image": entail(text, image, inter),
    "loss/entailment/box_text_box_image": entail(box_text, box_image, inter),
    "loss/entailment/box_image_image": entail(box_image, image, intra),
    "loss/entailment/box_text_text": entail(box_text, text, intra),
  }
  terms["loss/contrastive"] = 0.25 * sum(v for k, v in terms.items() if "contrastive/" in k)
  terms["loss/entailment"] = 0.5 * sum(v for k, v in terms.items() if "entailment/" in k)
  terms["loss"] = terms["loss/contrastive"] + settings.entail_weight * terms["loss/entailment"]
  return terms


@functools.cache
def hac_loss_and_grad():
  """(objective of configs/hac.py, jitted value-and-grad in the embeddings,
  curvature and logit scale): one compile for both parametrisations."""
  objective = hycoclip_lib.HycoclipObjective(hac_config.get_config().objective.to_dict())

  def total(batch, curv, scale):
    loss, (metrics, _) = objective.loss(
      GivenEmbeddings(curv, scale), {}, batch, rng=None, axis_name=None
    )
    return loss, metrics

  return objective, jax.jit(jax.value_and_grad(total, (0, 1, 2), has_aux=True))


@pytest.mark.parametrize(
  "eps, rtol",
  [
    # Without the release's guards the two are the same formula: float64
    # rounding through acosh / acos leaves ~1e-13.
    (0.0, 1e-10),
    # With them (eps 1e-8 added to O(0.1-1) denominators, clamps not hit at
    # these points): ~1e-8 relative per term, up to ~10x through acos's
    # derivative; 1e-6 bounds it and a wrong factor (0.25 vs 0.5, 0.7 vs
    # 1.2) moves a term by > 1e-2.
    (1e-8, 1e-6),
  ],
)
def test_hac_loss_parts_and_gradients_equal_the_release_in_float64(eps, rtol):
  objective, step = hac_loss_and_grad()
  settings = objective.settings
  assert (settings.entail_weight, settings.inter_modal_aperture) == (0.2, 0.7)
  assert settings.intra_modal_aperture == 1.2
  batch, curv, scale = boxed_embeddings(batch_size=6, dim=5), 1.3, 7.0
  with jax.enable_x64(True):
    inputs = (jax.tree.map(jnp.asarray, batch), jnp.asarray(curv), jnp.asarray(scale))
    (loss, metrics), grads = step(*inputs)
    grads = jax.tree.map(np.asarray, grads)

  leaves = {key: torch.tensor(value, requires_grad=True) for key, value in batch.items()}
  curv_t = torch.tensor(curv, dtype=torch.float64, requires_grad=True)
  scale_t = torch.tensor(scale, dtype=torch.float64, requires_grad=True)
  expected = release_loss(
    leaves["image"],
    leaves["tokens"],
    leaves["box_image"],
    leaves["box_tokens"],
    curv_t,
    scale_t,
    eps,
    settings,
  )
  expected["loss"].backward()
  got = {key: float(value) for key, value in metrics.items()}
  got["loss"] = float(loss)
  for key, value in expected.items():
    np.testing.assert_allclose(got[key], float(value.detach()), rtol=rtol, err_msg=key)
    if key.startswith("loss/entailment/"):
      assert 0 < got[key] < np.pi, key  # each hinge active, none saturated
  for key, value in leaves.items():
    np.testing.assert_allclose(
      grads[0][key], value.grad.numpy(), rtol=rtol, atol=rtol * 1e-2, err_msg=key
    )
  np.testing.assert_allclose(grads[1], curv_t.grad.item(), rtol=rtol)
  np.testing.assert_allclose(grads[2], scale_t.grad.item(), rtol=rtol)
