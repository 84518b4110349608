"""What `tools/aot` prints of a compiled step's figures (`aot.analyse`):
the report's lines, and the refusal with the levers when it does not fit."""

from __future__ import annotations

import jax

from hyperbolic_vl.tools import aot_targets
from hyperbolic_vl.training import preflight

GIB = 2**30


def _size(nbytes: float) -> str:
  if nbytes >= GIB / 10:
    return f"{nbytes / GIB:.2f} GiB"
  return f"{nbytes / 2**20:.2f} MiB"


def _seconds(value: float) -> str:
  if value < 1e-3:
    return f"{value * 1e6:.1f} us"
  return f"{value * 1e3:.2f} ms" if value < 1 else f"{value:.3f} s"


def report_lines(figures: dict) -> list[str]:
  family = figures["topology"].split(":")[0]
  chip = aot_targets.host_cpu() if family == "cpu" else aot_targets.CHIPS[family]
  mesh = " x ".join(f"{k}={v}" for k, v in figures["mesh"].items())
  lines = [
    f"Target {figures['topology']}: {figures['chips']} x {figures['chip']} ({figures['chip_source']}); "
    f"mesh {mesh}; batch {figures['global_batch']} = {figures['batch_per_chip']} per chip",
    f"Compiled in {figures['compile_s']:.1f}s on this host ({jax.default_backend()}, nothing run)",
    f"State per chip: params {_size(figures['params_bytes_per_chip'])} + optimizer state "
    f"{_size(figures['opt_state_bytes_per_chip'])} (train state "
    f"{_size(figures['state_bytes_per_chip'])}; what mesh.fsdp divides)",
  ]
  if "total_bytes_per_chip" in figures:
    verdict = "fits" if figures["fits"] else "does NOT fit"
    usable = figures["usable_bytes_per_chip"]
    against = (
      f"XLA's limit of {_size(usable)} for this chip ({_size(chip.memory_bytes)} in all)"
      if usable < chip.memory_bytes
      else f"{_size(chip.memory_bytes)}"
    )
    lines.append(
      f"Memory per chip: arguments {_size(figures['argument_bytes_per_chip'])} + temporaries "
      f"{_size(figures['temp_bytes_per_chip'])} + outputs {_size(figures['output_bytes_per_chip'])}"
      f" = {_size(figures['total_bytes_per_chip'])} against {against}: {verdict}"
    )
    if "xla_memory_warning" in figures:
      lines.append(f"  because XLA warned: {figures['xla_memory_warning']}")
  if "xla_refusal" in figures:
    lines.append(f"XLA refused to compile it: {figures['xla_refusal']}")
    return lines
  xla = figures["xla_flops_per_chip"]
  lines.append(
    f"FLOPs per chip per step: model {figures['model_flops_per_chip']:.4g} (tools/flops), "
    + (f"XLA counted {xla:.4g}" if xla else "XLA counted: not given by this backend")
  )
  program = figures["program"]
  lines.append(
    f"Program: {program['entry_fusions']} fusions, {program['entry_copies']} copies and "
    f"{program['entry_transposes']} transposes in its entry computation; "
    f"{program['cudnn_attention_calls']} cuDNN fused attention calls"
  )
  lines.append("Collectives per chip per step (count, buffer bytes, bytes sent; part of the step):")
  kinds = {kind: entry for kind, entry in figures["collectives"].items() if entry["count"]}
  if not kinds:
    lines.append("  none")
  for kind, entry in kinds.items():
    parts = ", ".join(f"{name} {n}" for name, n in sorted(entry["parts"].items()))
    across = entry["sent_bytes_across_hosts"]
    lines.append(
      f"  {kind:<18} {entry['count']:>5} x, {_size(entry['buffer_bytes']):>11}, sent "
      f"{_size(entry['sent_bytes'])}"
      + (f" ({_size(across)} across hosts)" if across else "")
      + f"; {parts}"
    )
  terms = figures["bound_terms_s"]
  if figures["bound_s"] is None:
    lines.append(
      "Step time lower bound: none for this host's CPU (no data-sheet figures; "
      "python -m hyperbolic_vl.tools.step_throughput measures its step)"
    )
    return lines
  sources = {
    "compute": f"FLOPs / {chip.peak_bf16_flops / 1e12:.0f} TFLOP/s bf16 peak",
    "memory": "XLA's bytes accessed"
    + (
      f" x {figures['loop_traffic_scale']:.2f} for its loops' trips"
      if figures["loop_traffic_scale"] > 1.0005
      else ""
    )
    + f" / {chip.memory_bandwidth / 1e9:.0f} GB/s HBM",
    "collectives": f"bytes sent / {chip.interconnect_bandwidth / 1e9:.0f} GB/s chip links"
    + (
      f", {chip.host_network_bandwidth / 1e9:.0f} GB/s between hosts"
      if chip.host_network_bandwidth
      else ""
    ),
  }
  lines.append(
    f"Step time lower bound: {_seconds(figures['bound_s'])} ({figures['bound_limited_by']}-bound) "
    "= max("
    + "; ".join(f"{name} {_seconds(value)} [{sources[name]}]" for name, value in terms.items())
    + ")"
    + ("" if "memory" in terms else "; bytes accessed: not given by this backend")
  )
  lines.append(
    f"Memory traffic estimate (the top-level ops' operands and outputs, {_size(figures['hbm_traffic_bytes_per_chip'])}"
    f" per step) over the HBM bandwidth: {_seconds(figures['hbm_traffic_s'])}"
  )
  mfu = figures["mfu_at_bound"]
  estimate = figures["xla_optimal_seconds"]
  lines.append(
    f"MFU the bound allows: {100 * mfu:.1f}%; XLA's own estimate: "
    + (f"{_seconds(estimate)}" if estimate else "not given by this backend")
  )
  return lines


def refusal(result, figures: dict) -> str | None:
  """The preflight's one line with the levers, against the target chip's memory."""
  gradient_bytes = figures["params_bytes_per_chip"]
  _, line = preflight.memory_line(
    result.config,
    result.compiled.memory,
    figures["chips"],
    gradient_bytes,
    device=(
      figures["usable_bytes_per_chip"],
      f"a {result.target.chip.name} has {{:.1f}} GiB"
      if figures["usable_bytes_per_chip"] >= result.target.chip.memory_bytes
      else f"XLA's limit for a {result.target.chip.name} is {{:.1f}} GiB",
    ),
  )
  return line
