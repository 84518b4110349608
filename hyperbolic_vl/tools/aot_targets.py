"""The hardware `tools/aot.py` compiles for, named as on the command line:
TPU slices as JAX names them (`v5e:2x2`, `v5p:4x4x8`) and GPUs as
`h100:8` (8 GPUs on one host) or `h100:4x8` (4 hosts x 8 GPUs); each
chip's data-sheet figures (peak, memory, bandwidths) and, for GPUs, the
target description XLA compiles against without a GPU.

The chip figures are the vendors' published ones (sources in CHIPS), used
for a lower bound on the step time: a peak or a bandwidth a chip never
exceeds keeps the bound a bound.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re

from hyperbolic_vl import errors

GIB = 2**30
AOT_EXTRA = 'pip install -e ".[aot]"'


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator's published figures."""

  name: str  # as printed
  platform: str  # "tpu" | "gpu" | "cpu"
  # The bound's figures; None for this host's CPU, which has no data sheet
  # here (its step time is measured: tools/step_throughput).
  peak_bf16_flops: float | None  # dense bf16 FLOP/s
  memory_bytes: int  # HBM per chip (the CPU: this host's memory)
  memory_bandwidth: float | None  # HBM bytes/s
  interconnect_bandwidth: float | None  # bytes/s a chip moves over its chip-to-chip links
  host_network_bandwidth: float | None  # GPUs: bytes/s per GPU between hosts
  source: str  # where the figures are from


# Google Cloud TPU system-architecture pages (per chip: "Peak compute per
# chip (bf16)", "HBM capacity", "HBM bandwidth", "Interchip Interconnect
# BW"); NVIDIA's H100 / H200 / A100 data sheets (SXM: dense BF16 Tensor
# Core, GPU memory and bandwidth, NVLink bandwidth, which is both
# directions together: half of it each way) and the DGX H100 / A100 system
# sheets for the network between hosts (one 400 / 200 Gb/s InfiniBand port
# per GPU).
CHIPS = {
  "v4": Chip("TPU v4", "tpu", 275e12, 32 * GIB, 1200e9, 2400e9 / 8, None, "Cloud TPU v4 page"),
  "v5e": Chip(
    "TPU v5 lite", "tpu", 197e12, 16 * GIB, 819e9, 1600e9 / 8, None, "Cloud TPU v5e page"
  ),
  "v5p": Chip("TPU v5p", "tpu", 459e12, 95 * GIB, 2765e9, 4800e9 / 8, None, "Cloud TPU v5p page"),
  "v6e": Chip(
    "TPU v6 lite", "tpu", 918e12, 32 * GIB, 1640e9, 3584e9 / 8, None, "Cloud TPU v6e page"
  ),
  "h100": Chip(
    "NVIDIA H100 80GB HBM3",
    "gpu",
    989e12,
    84_942_979_072,
    3.35e12,
    900e9 / 2,
    400e9 / 8,
    "H100 SXM5 data sheet; DGX H100 (ConnectX-7 400 Gb/s per GPU)",
  ),
  "h200": Chip(
    "NVIDIA H200 141GB HBM3e",
    "gpu",
    989e12,
    151_397_597_184,
    4.8e12,
    900e9 / 2,
    400e9 / 8,
    "H200 SXM data sheet; 400 Gb/s InfiniBand per GPU",
  ),
  "a100": Chip(
    "NVIDIA A100-SXM4-80GB",
    "gpu",
    312e12,
    85_100_068_864,
    2.039e12,
    600e9 / 2,
    200e9 / 8,
    "A100 SXM4 80GB data sheet; DGX A100 (HDR 200 Gb/s per GPU)",
  ),
  # No bf16 units: XLA computes bf16 products in float32 there; the peak is
  # the fp16 Tensor Core one (MERU's PyTorch AMP), so the bound stays a bound.
  "v100": Chip(
    "Tesla V100-SXM2-32GB",
    "gpu",
    125e12,
    32 * 10**9,
    900e9,
    300e9 / 2,
    4 * 100e9 / 8 / 8,
    "V100 SXM2 data sheet; DGX-1 (4 x 100 Gb/s InfiniBand for 8 GPUs)",
  ),
}

# What XLA:GPU needs to know of a GPU it does not see: the published
# figures of each part (SMs, shared memory and registers per SM, L2, clock,
# memory size and bandwidth, compute capability), the fields XLA's own GPU
# target specifications give, less those this jaxlib's proto does not have.
_GPU_DEVICE_INFO = {
  "h100": dict(
    shared_memory_per_core=233472,
    core_count=132,
    fpus_per_core=128,
    memory_bandwidth=3352320000000,
    l2_cache_size=52428800,
    clock_rate_ghz=1.98,
    device_memory_size=84942979072,
    shared_memory_per_block_optin=232448,
    compute_capability=(9, 0),
  ),
  "h200": dict(
    shared_memory_per_core=233472,
    core_count=132,
    fpus_per_core=128,
    memory_bandwidth=4800000000000,
    l2_cache_size=52428800,
    clock_rate_ghz=1.98,
    device_memory_size=151397597184,
    shared_memory_per_block_optin=232448,
    compute_capability=(9, 0),
  ),
  "a100": dict(
    shared_memory_per_core=167936,
    core_count=108,
    fpus_per_core=64,
    memory_bandwidth=2039040000000,
    l2_cache_size=41943040,
    clock_rate_ghz=1.41,
    device_memory_size=85100068864,
    shared_memory_per_block_optin=166912,
    compute_capability=(8, 0),
  ),
  "v100": dict(
    shared_memory_per_core=98304,
    core_count=80,
    fpus_per_core=64,
    memory_bandwidth=898048000000,
    l2_cache_size=6291456,
    clock_rate_ghz=1.53,
    device_memory_size=32 * 10**9,
    shared_memory_per_block_optin=98304,
    compute_capability=(7, 0),
  ),
}
# The cuDNN the compiled program is for: the 9.x line the `aot` extra's
# nvidia-cudnn-cu12 wheel installs (cuDNN's fused attention needs 9).
_CUDNN_VERSION = (9, 10, 0)


def gpu_target_config(chip: str) -> str:
  """The GpuTargetConfig text proto of `chip` ("h100", "h200", "a100")."""
  info = _GPU_DEVICE_INFO[chip]
  major, minor = info["compute_capability"]
  fields = {
    "threads_per_block_limit": 1024,
    "threads_per_warp": 32,
    "shared_memory_per_block": 49152,
    "shared_memory_per_core": info["shared_memory_per_core"],
    "threads_per_core_limit": 2048,
    "core_count": info["core_count"],
    "fpus_per_core": info["fpus_per_core"],
    "block_dim_limit_x": 2147483647,
    "block_dim_limit_y": 65535,
    "block_dim_limit_z": 65535,
    "memory_bandwidth": info["memory_bandwidth"],
    "l2_cache_size": info["l2_cache_size"],
    "clock_rate_ghz": info["clock_rate_ghz"],
    "device_memory_size": info["device_memory_size"],
    "shared_memory_per_block_optin": info["shared_memory_per_block_optin"],
    "registers_per_core_limit": 65536,
    "registers_per_block_limit": 65536,
  }
  lines = [f"  {key}: {value}" for key, value in fields.items()]
  lines.append(f"  cuda_compute_capability {{ major: {major} minor: {minor} }}")
  cudnn = " ".join(
    f"{k}: {v}" for k, v in zip(("major", "minor", "patch"), _CUDNN_VERSION, strict=True)
  )
  return (
    "gpu_device_info {\n" + "\n".join(lines) + "\n}\n"
    'platform_name: "CUDA"\n'
    f"dnn_version_info {{ {cudnn} }}\n"
    f'device_description_str: "{CHIPS[chip].name}"\n'
  )


@dataclasses.dataclass(frozen=True)
class Target:
  """A named topology: its chip, devices (JAX's abstract devices of the
  topology: nothing opened) and, for GPUs, the GPUs per host."""

  name: str
  chip: Chip
  devices: tuple
  gpus_per_host: int | None = None

  @property
  def platform(self) -> str:
    return self.chip.platform

  @property
  def num_chips(self) -> int:
    return len(self.devices)


def host_cpu() -> Chip:
  """This host's CPU as a target: its memory, and no bound's figures."""
  memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  return Chip("this host's CPU", "cpu", None, memory, None, None, None, "this host")


TPU_PATTERN = re.compile(r"^(v4|v5e|v5p|v6e):(\d+)x(\d+)(?:x(\d+))?$")
GPU_PATTERN = re.compile(r"^(h100|h200|a100|v100):(?:(\d+)x)?(\d+)$")
CPU_PATTERN = re.compile(r"^cpu:(\d+)$")
VALID_NAMES = (
  "TPU slices as JAX names them (v4:2x2x2, v5e:2x2, v5e:16x16, v5p:4x4x8, v6e:8x8) or GPUs as "
  "h100|h200|a100|v100:N (N GPUs on one host) or :HxN (H hosts x N GPUs), e.g. h100:8, h100:4x8; "
  "or cpu:N, N of this host's CPU devices (no extra needed)"
)


class MissingBackendError(errors.ConfigError):
  """The compiler of a topology's platform (libtpu, JAX's CUDA plugin) is
  not installed: the `aot` extra."""


def _missing(package: str, what: str) -> MissingBackendError:
  return MissingBackendError(
    f"compiling for {what} needs the {package} package, which is not installed: {AOT_EXTRA}"
  )


def installed(module: str) -> bool:
  """Whether `module` can be imported; a dotted name whose parent package
  is missing (jax_plugins without the CUDA plugin) counts as not installed
  (importlib raises there instead of answering None)."""
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:
    return False


def resolve(name: str) -> Target:
  """The Target `name` names; a one-line ConfigError naming the valid
  names, or the pip extra when the backend's package is missing."""
  name = (name or "").strip().lower()
  tpu, gpu, cpu = TPU_PATTERN.match(name), GPU_PATTERN.match(name), CPU_PATTERN.match(name)
  if not tpu and not gpu and not cpu:
    raise errors.ConfigError(f"unknown topology {name!r}; valid: {VALID_NAMES}")
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

  if cpu:
    devices = jax.devices("cpu")
    if not 1 <= int(cpu.group(1)) <= len(devices):
      raise errors.ConfigError(
        f"topology {name!r}: this host has {len(devices)} CPU devices "
        "(XLA_FLAGS=--xla_force_host_platform_device_count=N makes N)"
      )
    return Target(name, host_cpu(), tuple(devices[: int(cpu.group(1))]))

  if tpu:
    if not installed("libtpu"):
      raise _missing("libtpu", name)
    try:
      topology = topologies.get_topology_desc(topology_name=name, platform="tpu")
    except Exception as error:  # noqa: BLE001 (libtpu's refusal of a shape)
      message = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
      raise errors.ConfigError(
        f"libtpu does not know topology {name!r} ({message}); valid: {VALID_NAMES}"
      ) from None
    return Target(name, CHIPS[tpu.group(1)], tuple(topology.devices))
  if not installed("jax_plugins.xla_cuda12"):
    raise _missing("jax-cuda12-plugin", name)
  chip = gpu.group(1)
  hosts, per_host = int(gpu.group(2) or 1), int(gpu.group(3))
  if hosts < 1 or per_host < 1:
    raise errors.ConfigError(f"topology {name!r} names no GPU; valid: {VALID_NAMES}")
  # (slices x hosts per slice x devices per host): every host its own process.
  topology = topologies.get_topology_desc(
    "aot", "cuda", target_config=gpu_target_config(chip), topology=f"1x{hosts}x{per_host}"
  )
  return Target(name, CHIPS[chip], tuple(topology.devices), per_host)
