"""tools/flops reads the chips' peaks from tools/aot_targets' one table and
XLA's cost analysis through one reader."""

import types

import jax
import jax.numpy as jnp
import pytest

from hyperbolic_vl.tools import aot_targets, flops


@pytest.mark.parametrize(
  "device_kind, family",
  [
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("Tesla V100-SXM2-32GB", "v100"),
    ("TPU v4", "v4"),
    ("TPU v5 lite", "v5e"),
    ("TPU v6 lite", "v6e"),
  ],
)
def test_a_device_gets_its_chip_from_the_one_table(device_kind, family):
  device = types.SimpleNamespace(device_kind=device_kind)
  assert flops.chip_of(device) is aot_targets.CHIPS[family]
  assert flops.peak_flops(device) == aot_targets.CHIPS[family].peak_bf16_flops


def test_a_chip_the_table_lacks_has_no_peak():
  assert flops.peak_flops(types.SimpleNamespace(device_kind="cpu")) is None


def test_cost_analysis_counts_a_matrix_product():
  """XLA's count of an (8 x 16) @ (16 x 4) product: 2 FLOPs per multiply-add,
  2 * 8 * 16 * 4 = 1,024; its bytes are the operands' and the output's."""
  x = jax.ShapeDtypeStruct((8, 16), jnp.float32)
  w = jax.ShapeDtypeStruct((16, 4), jnp.float32)
  compiled = jax.jit(jnp.matmul).lower(x, w).compile()
  analysis = flops.cost_analysis(compiled)
  assert analysis["flops"] == 2 * 8 * 16 * 4
  assert analysis["bytes accessed"] == 4 * (8 * 16 + 16 * 4 + 8 * 4)
  assert flops.compiled_flops(compiled) == 2 * 8 * 16 * 4


def test_cost_analysis_of_a_backend_that_gives_none():
  for given in (None, [], [None], ({"flops": 3.0},)):
    compiled = types.SimpleNamespace(cost_analysis=lambda given=given: given)
    expected = {"flops": 3.0} if given == ({"flops": 3.0},) else {}
    assert flops.cost_analysis(compiled) == expected
  assert flops.compiled_flops(types.SimpleNamespace(cost_analysis=lambda: None)) is None
