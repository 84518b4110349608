"""KEY=VALUE overrides of a config, the one parser for every place that sets
config keys from text (a release's shrunk test models, `benchmarks/
release_table.py --override`; the command line's `--config.KEY=VALUE` reads
values the same way).

A KEY is a dotted path of keys that exist ("model.embed_dim"); a VALUE is
read as the type of the value it replaces: a boolean from true/false (or
1/0), an integer, a float (an integer written without a point too), text as
it is; a key whose value is None, a tuple or a list takes a Python literal
("(1, 2)", "None"), or text when it is none. A key that does not exist, or a
value that is not of its key's type, is one ConfigError line naming the
valid keys or the type."""

from __future__ import annotations

import ast
from collections.abc import Iterable

from hyperbolic_vl import errors

_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")
_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number"}


def split(override: str) -> tuple[list[str], str]:
  """ "a.b=VALUE" -> (["a", "b"], "VALUE")."""
  key, sep, text = override.partition("=")
  if not sep or not key.strip():
    raise errors.ConfigError(f"config override {override!r}: expected KEY=VALUE")
  return key.strip().split("."), text


def value_as(current, text: str, key: str):
  """`text` read as the type of `current` (see the module's docstring)."""
  try:
    if isinstance(current, bool):
      lowered = text.strip().lower()
      if lowered not in _TRUE + _FALSE:
        raise ValueError(text)
      return lowered in _TRUE
    if isinstance(current, int):
      return int(text)
    if isinstance(current, float):
      return float(text)
    if isinstance(current, str):
      return text
  except ValueError:
    raise errors.ConfigError(
      f"config override {key}={text}: {key} takes {_TYPE_WORDS[type(current)]}"
    ) from None
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def apply(config, overrides: Iterable[str]):
  """Sets each KEY=VALUE of `overrides` on `config` (an ml_collections
  ConfigDict, changed in place and returned)."""
  with config.unlocked():
    for override in overrides:
      keys, text = split(override)
      node = config
      for depth, part in enumerate(keys):
        if not hasattr(node, "keys") or part not in node:
          where = ".".join(["config", *keys[:depth]])
          valid = ", ".join(sorted(node.keys())) if hasattr(node, "keys") else "(a leaf value)"
          raise errors.ConfigError(
            f"config override {override!r}: {where} has no {part!r}; its keys: {valid}"
          )
        if depth < len(keys) - 1:
          node = node[part]
      key = ".".join(keys)
      node[keys[-1]] = value_as(node[keys[-1]], text, key)
  return config
