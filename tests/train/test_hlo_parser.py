"""tools/hlo_text.parse_hlo, the package's one HLO parser (tools/aot and
benchmarks/profile_split read programs with it), on a hand-written module
with the collectives beyond the five an fsdp step uses."""

import types

from hyperbolic_vl.tools import aot_targets, hlo_text

HLO = "\n".join(
  [
    "HloModule jit_step, entry_computation_layout={(f32[8]{0})->f32[8]{0}}",
    "",
    "%add (a: f32[], b: f32[]) -> f32[] {",
    "  %a = f32[] parameter(0)",
    "  %b = f32[] parameter(1)",
    "  ROOT %sum = f32[] add(%a, %b)",
    "}",
    "",
    "ENTRY %main (p: f32[8]) -> f32[8] {",
    "  %p = f32[8]{0} parameter(0)",
    "  %token = token[] after-all()",
    "  %send = (f32[8]{0}, u32[], token[]) send(%p, %token), channel_id=1, "
    'frontend_attributes={_xla_send_recv_source_target_pairs="{{0,1}}"}',
    "  %recv = (f32[8]{0}, u32[], token[]) recv(%token), channel_id=1, "
    'frontend_attributes={_xla_send_recv_source_target_pairs="{{0,1}}"}',
    "  %bcast = f32[8]{0} collective-broadcast(%p), replica_groups={{0,1}}",
    "  ROOT %r = f32[8]{0} all-reduce(%bcast), replica_groups={{0,1}}, to_apply=%add, "
    'metadata={op_name="jit(step)/psum"}',
    "}",
  ]
)


def test_parse_hlo_reads_computations_instructions_and_the_entry():
  module = hlo_text.parse_hlo(HLO)
  assert module.name == "jit_step" and module.entry == "main"
  assert list(module.computations) == ["add", "main"]
  assert [i.opcode for i in module.computations["main"]] == [
    "parameter",
    "after-all",
    "send",
    "recv",
    "collective-broadcast",
    "all-reduce",
  ]
  assert module.instructions["r"].op_name == "jit(step)/psum"
  assert module.lines("add")[-1] == "  ROOT %sum = f32[] add(%a, %b)"


def test_every_collective_kind_is_counted():
  """Each of the 32-byte f32[8] buffers: a send sends it whole, a receive
  sends nothing, a broadcast sends it whole, a 2-chip all-reduce
  2 (n - 1) / n of it."""
  target = aot_targets.Target("x", aot_targets.CHIPS["h100"], tuple(range(2)), 2)
  devices = [types.SimpleNamespace(process_index=0)] * 2
  kinds = hlo_text.collectives(HLO, target, devices)
  assert set(kinds) == set(hlo_text.COLLECTIVES) and len(hlo_text.COLLECTIVES) == 9
  sent = {kind: entry["sent_bytes"] for kind, entry in kinds.items() if entry["count"]}
  assert sent == {"send": 32.0, "recv": 0.0, "collective-broadcast": 32.0, "all-reduce": 32.0}
  assert kinds["send"]["buffer_bytes"] == 32 and kinds["recv"]["buffer_bytes"] == 32
