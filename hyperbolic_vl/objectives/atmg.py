"""ATMG, "Accept the Modality Gap" (Ramasinghe et al., CVPR 2024).

Angle-based contrastive loss plus an Einstein-midpoint centroid regulariser,
on MERU's Lorentz two towers. x: text, y: image embeddings (space
components, hyperboloid of curvature -c), s = exp(log_logit_scale).

  alpha_ij = ext(x_i, y_j)      exterior angle AT THE TEXT x_i towards image
                                y_j (eq. 9; MERU's oxy_angle). 0 when y_j lies
                                on the ray O -> x_i beyond x_i.
  beta_ij  = ext(y_j, x_i)      exterior angle AT THE IMAGE y_j towards x_i,
                                pi - angle(O, y_j, x_i). pi when x_i lies on
                                the segment O -> y_j (text between the origin
                                and its image), 0 when the text is beyond.

  L_angle    = L^{T->I}(-alpha) + L^{T->I}(beta)                     (eq. 11)
               L^{T->I}(k) = mean_i CE_j(s * k_ij; target i): text rows
               against the images of the global batch only (asymmetric:
               text is the generic side, the image is "explained" by it).
  L_centroid = |d(O, x_e) - r_text| + |d(O, y_e) - r_image|         (eq. 12)
               x_e, y_e: Einstein midpoints (Klein coordinates, eq. 5-6) of
               the text / image embeddings of the all-gathered global batch;
               d(O, .) the geodesic distance to the origin; r_image > r_text.
  L = L_angle + lambda * L_centroid                                  (eq. 13)

Second term (the paper's beta). Taken literally, beta = pi - alpha makes
L^{T->I}(beta) = CE(s*pi - s*alpha) = CE(-s*alpha) (softmax is shift
invariant): the same term twice. The paper's figure 3 and footnote 2 ("explicitly
maximising beta imposes a stronger bias") describe a second angle of the
triangle O-x-y; we take the exterior angle at the image. alpha is small
when the image sits inside a narrow cone around the text's ray beyond the
text; beta is large when the text sits near the geodesic from the image back
to the origin. The two angles of one triangle move together but are not
affine in each other (they differ by the triangle's angle defect and the
interior angle at O), so the second term adds a genuinely different signal:
it also penalises texts whose ray is right but which lie off the image's
root-ward geodesic. Both are optimal for a matching pair placed
"origin - text - image" along one geodesic (alpha = 0, beta = pi), so they
never conflict.

Centroid regulariser. Eq. 12 subtracts a scalar, acosh(c q)/sqrt(c), from a
point; the evident intent (and the text around it: "the centroid of text
embeddings should be closer to the origin than the centroid of image
embeddings") is the distance of each centroid from the origin against a
target distance. We take the targets as distances directly
(`centroid_text_radius` = q, `centroid_image_radius` = p, p > q), so they
mean the same thing at every (learned or fixed) curvature.

Inference (section 6): zero-shot picks the class whose prompts have the
smallest MEAN exterior angle alpha to the image (each prompt lifted on its
own, no tangent averaging); retrieval ranks by alpha. `score` returns -alpha
so higher is more similar, as the evaluators expect.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hyperbolic_vl.geometry import lorentz
from hyperbolic_vl.objectives import base


def angle_logits(text: jax.Array, all_image: jax.Array, curv) -> tuple[jax.Array, jax.Array]:
  """(alpha, beta), each (b, B): local texts (rows) vs global images (columns).

  alpha_ij = ext(text_i, image_j) (angle at the text),
  beta_ij  = ext(image_j, text_i) (angle at the image).
  """
  alpha = lorentz.pairwise_oxy_angle(text, all_image, curv)
  beta = lorentz.pairwise_oxy_angle(all_image, text, curv).T
  return alpha, beta


def centroid_regulariser(
  all_text: jax.Array, all_image: jax.Array, curv, text_radius: float, image_radius: float
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """|d(O, mid(text)) - r_text| + |d(O, mid(image)) - r_image| and the two distances."""
  text_d = lorentz.dist_to_origin(lorentz.einstein_midpoint(all_text, curv), curv)
  image_d = lorentz.dist_to_origin(lorentz.einstein_midpoint(all_image, curv), curv)
  return jnp.abs(text_d - text_radius) + jnp.abs(image_d - image_radius), text_d, image_d


class AtmgObjective(base.Objective):
  name = "atmg"
  geometry = "lorentz"

  @property
  def centroid_weight(self) -> float:
    return float(self.config.get("centroid_weight", 0.1))

  @property
  def text_radius(self) -> float:
    return float(self.config.get("centroid_text_radius", 0.5))

  @property
  def image_radius(self) -> float:
    return float(self.config.get("centroid_image_radius", 1.0))

  def loss(self, model, aux, batch, *, rng, axis_name):
    del rng
    image = model.encode_image(batch["image"])
    text = model.encode_text(batch["tokens"])
    curv = model.curv()
    scale = model.logit_scale()
    all_image = base.gather_columns(image, axis_name)
    all_text = base.gather_columns(text, axis_name)
    alpha, beta = angle_logits(text, all_image, curv)
    targets = base.local_targets(text.shape[0], axis_name)
    loss_alpha = base.cross_entropy(-scale * alpha, targets)
    loss_beta = base.cross_entropy(scale * beta, targets)
    angle = loss_alpha + loss_beta
    # Every device computes the same centroids from the gathered batch; the
    # step's pmean then counts the term once, and the all_gather transpose
    # sums the 1/n shares of its gradient back onto each producing device.
    centroid, text_d, image_d = centroid_regulariser(
      all_text, all_image, curv, self.text_radius, self.image_radius
    )
    total = angle + self.centroid_weight * centroid
    positives = jnp.take_along_axis(alpha, targets[:, None], axis=1)[:, 0]
    metrics = {
      "loss/angle": angle,
      "loss/angle_alpha": loss_alpha,
      "loss/angle_beta": loss_beta,
      "loss/centroid": centroid,
      "centroid_dist_origin/text": text_d,
      "centroid_dist_origin/image": image_d,
      "mean_positive_alpha": positives.mean(),
      "mean_dist_origin/image": lorentz.dist_to_origin(image, curv).mean(),
      "mean_dist_origin/text": lorentz.dist_to_origin(text, curv).mean(),
      **self.scalar_metrics(model),
    }
    return total, (metrics, aux)

  # -- evaluation ---------------------------------------------------------------
  def score(self, model, image_emb, text_emb):
    """-alpha (higher = better). image (N, D); text (M, D) or (M, P, D).

    With (M, P, D) (prompt ensembles from `class_embedding`) the score is
    minus the mean angle over the P prompts of each class.
    """
    curv = model.curv()
    if text_emb.ndim == 3:
      classes, prompts, dim = text_emb.shape
      alpha = lorentz.pairwise_oxy_angle(text_emb.reshape(-1, dim), image_emb, curv)
      return -alpha.reshape(classes, prompts, -1).mean(axis=1).T
    return -lorentz.pairwise_oxy_angle(text_emb, image_emb, curv).T

  def class_embedding(self, model, prompt_tangents):
    # Keep every prompt: ATMG averages the angles, not the embeddings.
    return model.lift(prompt_tangents)
