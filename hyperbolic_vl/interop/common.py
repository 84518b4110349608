"""Reading PyTorch checkpoints and accounting for every tensor, both ways.

Each release layout (meru.py, open_clip.py, hf_clip.py) is one table: a
list of `Param` entries (our flat param name "image_tower/encoder/blocks/0/
attn/qkv/kernel" <-> the release's tensor names, with a `Layout` that maps
between the two storage conventions in either direction) and `Buffer`
entries (release tensors with no param here: checked on the way in,
recomputed on the way out). The same table drives conversion into this
codebase (`Conversion.apply`) and export out of it (`export_tensors`), so
the two directions cannot drift apart.

A conversion maps each parameter of the target model (a flat dict name ->
shape, from the config's abstract model) to source tensors. `Conversion`
records which source names were used, which target params were filled and
every shape disagreement, and `Conversion.finish` refuses a partial result:
an unused source tensor (unless a release-specific allow-list names it, and
then it is reported), a missing target parameter or a shape mismatch raise
`ConversionError` listing names. An export refuses params the table has no
place for (`ExportError`), so nothing of a run is dropped silently.

torch is imported only to read pickled `.pth`/`.bin` files; `.safetensors`
files are read with safetensors' NumPy loader, without torch.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

import jax
import numpy as np

# How many names an error message lists before "... and N more".
MAX_LISTED = 10


class ConversionError(ValueError):
  """The checkpoint does not match the config, or cannot be read."""


class UnreadableCheckpoint(ConversionError):
  """A file that cannot be read as a checkpoint at all (no torch pickle, no
  safetensors): a download of the wrong thing, cut short or corrupt."""


class ExportError(ValueError):
  """The run's params do not fit the release layout asked for."""


def _listing(names: Iterable[str]) -> str:
  names = list(names)
  shown = ", ".join(names[:MAX_LISTED])
  more = len(names) - MAX_LISTED
  return shown + (f", ... and {more} more" if more > 0 else "")


def _to_numpy(value) -> np.ndarray:
  if isinstance(value, np.ndarray):
    return value
  if hasattr(value, "detach"):  # a torch tensor; bf16/fp16 go through float32
    tensor = value.detach().cpu()
    if not tensor.is_floating_point():
      return tensor.numpy()
    return tensor.float().numpy()
  return np.asarray(value)


# The metadata "format" of this package's own safetensors export (export.py).
OWN_SAFETENSORS_FORMAT = "hyperbolic_vl.export/safetensors/1"


def _refuse_our_own_export(path: str) -> None:
  """ConversionError when `path` is `export --format=safetensors` of a run:
  its names are this package's params, no release's, so no --source maps them."""
  from safetensors import safe_open  # optional dependency (interop extra)

  with safe_open(path, "np") as f:
    metadata = f.metadata() or {}
  if metadata.get("format") == OWN_SAFETENSORS_FORMAT:
    raise ConversionError(
      f"{path} is this package's own safetensors export of a run (names of its params, no "
      "release's): read it with hyperbolic_vl.export.read_safetensors; for a file --source "
      "reads, export the run in that release's layout (--format=meru, uncha, open_clip or hysac)"
    )


def _reader_reason(error: Exception) -> str:
  """A reader's exception as one line: its type and the line that says what
  was wrong. torch's weights-only unpickler wraps the reason ("Unsupported
  operand 95", what random bytes or an HTML page give) in a paragraph of
  advice across several lines, which a one-line error cannot carry."""
  text = str(error)
  marker = "WeightsUnpickler error:"
  if marker in text:
    text = text.split(marker, 1)[1]
  reason = next((line.strip() for line in text.splitlines() if line.strip()), "")
  return f"{type(error).__name__}: {reason}" if reason else type(error).__name__


def load_state_dict(path: str) -> dict[str, np.ndarray]:
  """Reads a checkpoint file into {name: float32 or integer numpy array}.

  Accepts `.safetensors` (no torch needed) and torch pickles: a bare state
  dict, or one nested under "model" (MERU's training checkpoints) or
  "state_dict"; a "module." prefix (DistributedDataParallel) is removed.
  """
  if not os.path.isfile(path):
    raise ConversionError(f"checkpoint file not found: {path}")
  size = os.path.getsize(path)
  if path.endswith(".safetensors"):
    from safetensors.numpy import load_file  # optional dependency (interop extra)

    try:
      tensors = load_file(path)
    except Exception as e:  # safetensors raises its own SafetensorError
      raise UnreadableCheckpoint(
        f"cannot read {path} ({size} bytes) as safetensors: truncated or corrupt file? "
        f"({_reader_reason(e)})"
      ) from e
    _refuse_our_own_export(path)
  else:
    try:
      import torch  # optional dependency (interop extra)
    except ImportError as e:
      raise ConversionError(
        f"reading {path} needs torch: pip install 'hyperbolic_vl[interop]' "
        "(or convert a .safetensors file, which needs no torch)"
      ) from e
    try:
      loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # zip reader errors, EOFError, unpickling errors
      raise UnreadableCheckpoint(
        f"cannot read {path} ({size} bytes) as a torch checkpoint: truncated or corrupt "
        f"file? ({_reader_reason(e)})"
      ) from e
    for nested in ("model", "state_dict"):
      if isinstance(loaded, Mapping) and isinstance(loaded.get(nested), Mapping):
        loaded = loaded[nested]
        break
    if not isinstance(loaded, Mapping):
      raise ConversionError(f"{path} holds a {type(loaded).__name__}, not a state dict")
    tensors = {}
    for name, value in loaded.items():
      if not hasattr(value, "shape") and not isinstance(value, (int, float)):
        raise ConversionError(f"{path}: entry {name!r} is a {type(value).__name__}, not a tensor")
      tensors[name] = _to_numpy(value)
  if tensors and all(name.startswith("module.") for name in tensors):
    tensors = {name[len("module.") :]: value for name, value in tensors.items()}
  return tensors


def flatten(params: Mapping) -> dict:
  """{"a/b/c": leaf} of a nested dict (integer keys written as digits)."""
  return {
    "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): leaf
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
  }


def flat_param_shapes(params: Mapping) -> dict[str, tuple[int, ...]]:
  """{"a/b/c": shape} for a nested param dict (arrays or ShapeDtypeStructs)."""
  return {name: tuple(leaf.shape) for name, leaf in flatten(params).items()}


def unflatten(flat: Mapping[str, np.ndarray], template: Mapping) -> dict:
  """Nests {"a/b/c": array} like `template` (integer keys stay integers)."""

  def build(node, prefix):
    if isinstance(node, Mapping):
      return {key: build(value, f"{prefix}{key}/") for key, value in node.items()}
    return flat[prefix[:-1]]

  return build(template, "")


class Conversion:
  """Source tensors in, target params out, every name accounted for."""

  def __init__(
    self,
    source: Mapping[str, np.ndarray],
    target_shapes: Mapping[str, tuple[int, ...]],
    *,
    ignorable: Iterable[str] = (),
  ):
    self.source = dict(source)
    self.target_shapes = dict(target_shapes)
    self.ignorable = [re.compile(pattern) for pattern in ignorable]
    self.used: set[str] = set()
    self.missing_source: list[str] = []
    self.mismatches: list[str] = []
    self.params: dict[str, np.ndarray] = {}

  def has(self, name: str) -> bool:
    return name in self.source

  def take(self, name: str) -> np.ndarray | None:
    """The source tensor `name`, marked used; None (and recorded) if absent."""
    if name not in self.source:
      self.missing_source.append(name)
      return None
    self.used.add(name)
    return self.source[name]

  def check(self, name: str, predicate: Callable[[np.ndarray], bool], why: str) -> None:
    """Consumes a source tensor that has no target (a buffer) after checking
    it holds what the config implies (e.g. MERU's frozen sin-cos table)."""
    value = self.take(name)
    if value is not None and not predicate(value):
      self.mismatches.append(f"{name}: {why}")

  def put(
    self,
    target: str,
    names: str | tuple[str, ...],
    transform: Callable[..., np.ndarray] = lambda x: x,
  ) -> None:
    """Fills target param `target` with transform(*source tensors)."""
    names = (names,) if isinstance(names, str) else names
    values = [self.take(name) for name in names]
    if any(value is None for value in values):
      return
    if target not in self.target_shapes:
      self.mismatches.append(
        f"{'+'.join(names)}: the config's model has no parameter {target} "
        "(does --config match the checkpoint's architecture?)"
      )
      return
    array = np.asarray(transform(*values), np.float32)
    expected = self.target_shapes[target]
    if array.shape != expected:
      source_shapes = ", ".join(str(tuple(v.shape)) for v in values)
      self.mismatches.append(
        f"{target}: checkpoint {'+'.join(names)} {source_shapes} gives {array.shape}, "
        f"config expects {expected}"
      )
      return
    self.params[target] = array

  def apply(self, table: Iterable[Entry]) -> None:
    """Fills params and checks buffers as `table` says (see `Param`, `Buffer`)."""
    for entry in table:
      if isinstance(entry, Param):
        self.put(entry.ours, entry.theirs, entry.layout.to_ours)
      elif entry.required or self.has(entry.theirs):
        self.check(entry.theirs, entry.holds, entry.why)

  def finish(self) -> tuple[dict[str, np.ndarray], list[str]]:
    """(filled flat params, ignored source names) or ConversionError."""
    unused = sorted(set(self.source) - self.used)
    ignored = [name for name in unused if any(p.fullmatch(name) for p in self.ignorable)]
    unused = [name for name in unused if name not in ignored]
    missing_target = sorted(
      set(self.target_shapes) - set(self.params) - {m.split(":")[0] for m in self.mismatches}
    )
    problems = []
    if self.mismatches:
      problems.append(
        f"{len(self.mismatches)} shape/value mismatches vs --config (first ones):\n    "
        + "\n    ".join(self.mismatches[:MAX_LISTED])
      )
    if self.missing_source:
      problems.append(
        f"{len(self.missing_source)} tensors the config needs are not in the checkpoint: "
        + _listing(self.missing_source)
      )
    if missing_target:
      problems.append(
        f"{len(missing_target)} model parameters got no value: " + _listing(missing_target)
      )
    if unused:
      problems.append(f"{len(unused)} checkpoint tensors would be left unused: " + _listing(unused))
    if problems:
      raise ConversionError("checkpoint does not match the config:\n  " + "\n  ".join(problems))
    return self.params, ignored


# -- layout transforms (PyTorch <-> Flax) ------------------------------------
def linear_kernel(weight: np.ndarray) -> np.ndarray:
  """nn.Linear stores (out, in); a Flax kernel is (in, out)."""
  return weight.T


def linear_weight(kernel: np.ndarray) -> np.ndarray:
  """A Flax (in, out) kernel -> nn.Linear's (out, in) weight."""
  return kernel.T


def conv_kernel(weight: np.ndarray) -> np.ndarray:
  """(out, in, kh, kw) PyTorch conv -> (kh, kw, in, out) Flax (NHWC)."""
  return weight.transpose(2, 3, 1, 0)


def conv_weight(kernel: np.ndarray) -> np.ndarray:
  """(kh, kw, in, out) Flax conv kernel -> (out, in, kh, kw) PyTorch."""
  return kernel.transpose(3, 2, 0, 1)


def scalar(value: np.ndarray) -> np.ndarray:
  return np.asarray(value, np.float32).reshape(())


def _same(value: np.ndarray) -> np.ndarray:
  return value


@dataclasses.dataclass(frozen=True)
class Layout:
  """How one of our params is stored in a release, in both directions:
  `to_ours(*release tensors)` gives our array; `to_theirs(ours)` gives the
  release tensor, or a tuple of them when one param is several tensors
  there (Hugging Face's separate q, k, v). Each is the other's inverse."""

  to_ours: Callable[..., np.ndarray]
  to_theirs: Callable[[np.ndarray], np.ndarray | tuple[np.ndarray, ...]]


SAME = Layout(_same, _same)
LINEAR = Layout(linear_kernel, linear_weight)
CONV = Layout(conv_kernel, conv_weight)
SCALAR = Layout(scalar, scalar)  # torch scalars are 0-d tensors, as ours are


# q, k, v stored apart (Hugging Face): our fused kernel is [q | k | v] along
# its output axis, and the fused bias the same.
SPLIT_QKV_KERNEL = Layout(
  lambda q, k, v: np.concatenate([q, k, v], axis=0).T,
  lambda kernel: tuple(np.split(kernel.T, 3, axis=0)),
)
SPLIT_QKV_BIAS = Layout(
  lambda q, k, v: np.concatenate([q, k, v], axis=0),
  lambda bias: tuple(np.split(bias, 3, axis=0)),
)


# -- the tables ---------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Param:
  """Our param `ours` is the release's tensor(s) `theirs` under `layout`."""

  ours: str
  theirs: str | tuple[str, ...]
  layout: Layout = SAME

  @property
  def names(self) -> tuple[str, ...]:
    return (self.theirs,) if isinstance(self.theirs, str) else tuple(self.theirs)


@dataclasses.dataclass(frozen=True)
class Buffer:
  """A release tensor with no param here (a frozen table, a mask, pixel
  statistics, a fixed curvature). Conversion checks it holds what the
  config implies (`holds`, else the message `why`), and fails when it is
  absent only if `required`; export writes `value()` when given (the
  release's model expects it in its state dict) and leaves it out when
  None (a release-file extra its model does not hold)."""

  theirs: str
  holds: Callable[[np.ndarray], bool]
  why: str
  value: Callable[[], np.ndarray] | None = None
  required: bool = False


Entry = Param | Buffer


def block_entries(
  target: str, source: str, names: Mapping[str, str | tuple[str, ...]]
) -> list[Param]:
  """One pre-LN block. `names` maps our leaf groups to source sub-names:
  norm1, norm2, qkv (one fused name or a (q, k, v) triple), out, fc1, fc2."""
  entries = []
  for ours in ("norm1", "norm2"):
    entries.append(Param(f"{target}/{ours}/scale", f"{source}.{names[ours]}.weight"))
    entries.append(Param(f"{target}/{ours}/bias", f"{source}.{names[ours]}.bias"))
  qkv = names["qkv"]
  if isinstance(qkv, str):
    entries.append(Param(f"{target}/attn/qkv/kernel", f"{source}.{qkv}weight", LINEAR))
    entries.append(Param(f"{target}/attn/qkv/bias", f"{source}.{qkv}bias"))
  else:
    entries.append(
      Param(
        f"{target}/attn/qkv/kernel",
        tuple(f"{source}.{n}.weight" for n in qkv),
        SPLIT_QKV_KERNEL,
      )
    )
    entries.append(
      Param(f"{target}/attn/qkv/bias", tuple(f"{source}.{n}.bias" for n in qkv), SPLIT_QKV_BIAS)
    )
  for ours, path in (("out", "attn/out"), ("fc1", "mlp/fc1"), ("fc2", "mlp/fc2")):
    entries.append(Param(f"{target}/{path}/kernel", f"{source}.{names[ours]}.weight", LINEAR))
    entries.append(Param(f"{target}/{path}/bias", f"{source}.{names[ours]}.bias"))
  return entries


def export_tensors(table: Sequence[Entry], flat_params: Mapping[str, np.ndarray]) -> dict:
  """The release's {name: array} for our flat params, by `table`: every
  param must have exactly one place in it, and every param the table names
  must exist, else `ExportError` listing the names."""
  out: dict[str, np.ndarray] = {}
  placed, absent = set(), []
  for entry in table:
    if isinstance(entry, Buffer):
      if entry.value is not None:
        out[entry.theirs] = np.asarray(entry.value())
      continue
    if entry.ours not in flat_params:
      absent.append(entry.ours)
      continue
    values = entry.layout.to_theirs(np.asarray(flat_params[entry.ours]))
    values = values if isinstance(values, tuple) else (values,)
    for name, value in zip(entry.names, values, strict=True):
      out[name] = np.array(value, order="C")  # a copy; keeps 0-d scalars 0-d
    placed.add(entry.ours)
  unplaced = sorted(set(flat_params) - placed)
  problems = []
  if unplaced:
    problems.append(f"{len(unplaced)} params have no place in this layout: {_listing(unplaced)}")
  if absent:
    problems.append(f"{len(absent)} params the layout needs are missing: {_listing(absent)}")
  if problems:
    raise ExportError("; ".join(problems))
  return out


def count_blocks(source: Mapping[str, np.ndarray], prefix: str) -> int:
  """Number of blocks `prefix.N.*` in the source (N = 0, 1, ...)."""
  pattern = re.compile(re.escape(prefix) + r"\.(\d+)\.")
  found = {int(m.group(1)) for name in source if (m := pattern.match(name))}
  return max(found) + 1 if found else 0


def count_target_blocks(target_shapes: Mapping[str, tuple], tower: str) -> int:
  pattern = re.compile(re.escape(tower) + r"/encoder/blocks/(\d+)/")
  found = {int(m.group(1)) for name in target_shapes if (m := pattern.match(name))}
  return max(found) + 1 if found else 0


def lora_delta(a: np.ndarray, b: np.ndarray, scale: float) -> np.ndarray:
  """PEFT's LoRA update scale * B A in float64, in the base weight's shape
  ((out, in) or a conv's); scale is alpha / r, or alpha / sqrt(r) for
  rank-stabilised LoRA (use_rslora)."""
  rank = a.shape[0]
  delta = b.reshape(b.shape[0], rank).astype(np.float64) @ a.reshape(rank, -1).astype(np.float64)
  return scale * delta.reshape((b.shape[0],) + a.shape[1:])


def place_adapters(
  conversion: Conversion,
  kept: Mapping[str, tuple[np.ndarray, np.ndarray]],
  target_shapes: Mapping[str, tuple[int, ...]],
) -> None:
  """The adapters a file holds ((down, up) by module path) into
  `conversion.params`, each checked against the config's model, and every
  adapter of the config that the file lacks noted as a mismatch."""
  for path, pair in kept.items():
    for leaf, value in zip(("down", "up"), pair, strict=True):
      name = f"{path}/{leaf}"
      if name not in target_shapes:
        conversion.mismatches.append(f"{name}: the config's model has no such adapter")
      elif tuple(value.shape) != tuple(target_shapes[name]):
        conversion.mismatches.append(
          f"{name}: checkpoint gives {value.shape}, config expects {target_shapes[name]}"
        )
      else:
        conversion.params[name] = np.asarray(value, np.float32)
  missing = sorted({n.rsplit("/", 1)[0] for n in target_shapes if "/lora_" in n} - set(kept))
  if missing:
    conversion.mismatches.append(
      f"{len(missing)} adapters of the config are not in the file: {missing[:3]}"
    )
