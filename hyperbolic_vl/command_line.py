"""The command line of the commands that take a `--config` file: one parser
for `main`, `tools/aot` and the rest, so that a config file that is not
there, a wrong value, a missing flag or an override that names no key reads
the same (one line, the valid keys listed) whichever command was typed.

And the one reader of KEY=VALUE overrides given as text (`apply_overrides`):
KEY=VALUE overrides of a config, the one parser for every place that sets
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

import ast
import importlib.util
import os
import re
import sys
from collections.abc import Iterable

from absl import flags

from hyperbolic_vl import errors


def _load_config(spec: str):
  path, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("_user_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def _config_spec(argv) -> str | None:
  """The value of --config= ("configs/meru.py:vit_l"), if given."""
  return next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)


def _unknown_override_message(argv, error: Exception) -> str | None:
  """Names the valid keys when a --config.a.b=... override does not exist."""
  spec = _config_spec(argv)
  if spec is None:
    return None
  config = _load_config(spec)
  for arg in argv:
    match = re.match(r"--config\.([\w.]+)", arg)
    if not match:
      continue
    node, walked = config, []
    for part in match.group(1).split("."):
      if not hasattr(node, "keys") or part not in node:
        where = ".".join(["config"] + walked)
        valid = ", ".join(sorted(node.keys())) if hasattr(node, "keys") else "(a leaf value)"
        source = ""
        if walked[:2] == ["input", "data"]:
          # Another source's key: its section comes with the source's name.
          source = (
            f" (the keys of source {config.input.data.get('name')!r}; another source's come "
            "with --config.input.data.name=NAME, e.g. image_text_csv)"
          )
        return (
          f"error: unknown config key {match.group(1)!r}: {where} has no {part!r}.\n"
          f"Valid keys of {where}: {valid}{source}"
        )
      node, walked = node[part], walked + [part]
  return None


def _config_file_message(argv) -> str | None:
  """Names a --config file that does not exist (config_flags' own report is
  a 40-line traceback)."""
  spec = _config_spec(argv)
  if spec is None:
    return None
  path = spec.partition(":")[0]
  if os.path.isfile(path):
    return None
  return f"error: config file not found: {path} (--config={spec}; run from the repository root)"


def _flag_value_message(error: Exception, example: str) -> str:
  text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
  missing = re.match(r"flag --(\w+)=None", text)
  if missing:
    return f"--{missing.group(1)} is required, e.g. {example}"
  return text.removeprefix("flag ")


DATA_NAME_FLAG = "--config.input.data.name="


def _source_named_on_the_command_line(argv) -> list[str]:
  """`argv` with `--config.input.data.name=NAME` made the config argument
  `data=NAME` (--config=configs/meru.py:data=NAME): the config file then
  builds `input.data` as that source's section, each of its keys
  overridable, where overriding the name alone would keep the file's own
  source's keys under the new name."""
  names = [arg[len(DATA_NAME_FLAG) :] for arg in argv if arg.startswith(DATA_NAME_FLAG)]
  spec = _config_spec(argv)
  if not names or spec is None:
    return argv
  path, _, arg = spec.partition(":")
  items = [item for item in arg.split(",") if item.strip()]
  given = [value for key, _, value in (i.partition("=") for i in items) if key.strip() == "data"]
  if given and given[-1].strip() != names[-1]:
    raise errors.ConfigError(
      f"{DATA_NAME_FLAG}{names[-1]} and the config argument data={given[-1]} name two "
      "sources; give one"
    )
  if not given:
    items.append(f"data={names[-1]}")
  return [
    f"--config={path}:{','.join(items)}" if a.startswith("--config=") else a
    for a in argv
    if not a.startswith(DATA_NAME_FLAG)
  ]


def parse_flags(argv: list[str], flag_values, example: str):
  """`flag_values` parsed from `argv` (absl's flags_parser for a command
  with a `--config` file and its `--config.KEY=VALUE` overrides): a config
  file that is not there, a value of the wrong type, a required flag left
  out (`example` shows the command), an override naming no key (the valid
  keys listed) or the config file's own error is one line on stderr and
  exit EXIT_USER_ERROR; `--verbose` keeps the traceback."""
  message = _config_file_message(argv)
  if message is not None:
    print(message, file=sys.stderr)
    sys.exit(errors.EXIT_USER_ERROR)
  try:
    argv = _source_named_on_the_command_line(argv)
  except errors.ConfigError as error:
    print(f"error: {error}", file=sys.stderr)
    sys.exit(errors.EXIT_USER_ERROR)
  try:
    return flag_values(argv)
  except flags.IllegalFlagValueError as error:
    # A value of the wrong type (--config.total_steps=abc or 1.5) or a
    # required flag left out: absl's own first line says which.
    if "--verbose" in argv:
      raise
    # The config file's own error (a bad variant or argument) comes wrapped
    # in this one: its message is the line to show.
    cause = errors.innermost_user_error(error)
    message = errors.one_line(cause) if cause is not None else _flag_value_message(error, example)
    print(f"error: {message}", file=sys.stderr)
    sys.exit(errors.EXIT_USER_ERROR)
  except (AttributeError, KeyError) as error:
    message = _unknown_override_message(argv, error)
    if message is None:
      raise
    print(message, file=sys.stderr)
    sys.exit(errors.EXIT_USER_ERROR)
  except Exception as error:
    # The config file's own error (a bad variant or argument), which
    # config_flags and absl re-raise wrapped in their tracebacks.
    cause = errors.innermost_user_error(error)
    if cause is None or "--verbose" in argv:
      raise
    print(f"error: {errors.one_line(cause)}", file=sys.stderr)
    sys.exit(errors.EXIT_USER_ERROR)


# -- KEY=VALUE overrides given as text ------------------------------------------
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")
_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number"}


def split_override(override: str) -> tuple[list[str], str]:
  """ "a.b=VALUE" -> (["a", "b"], "VALUE")."""
  key, sep, text = override.partition("=")
  if not sep or not key.strip():
    raise errors.ConfigError(f"config override {override!r}: expected KEY=VALUE")
  return key.strip().split("."), text


def override_value(current, text: str, key: str):
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


def apply_overrides(config, overrides: Iterable[str]):
  """Sets each KEY=VALUE of `overrides` on `config` (an ml_collections
  ConfigDict, changed in place and returned)."""
  with config.unlocked():
    for override in overrides:
      keys, text = split_override(override)
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
      node[keys[-1]] = override_value(node[keys[-1]], text, key)
  return config
