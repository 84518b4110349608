"""The workdir's config.json: a resumed run is refused when its model or
objective changed, checking never writes, and the file is never seen
half-written by the other processes of a run, which read it while process 0
writes it."""

import json
import threading

import pytest
from tiny_runs import small_config

from hyperbolic_vl.runs import checkpointing, run_dir


def test_a_changed_model_is_refused_naming_the_setting(tmp_path):
  config = small_config()
  run_dir.check_config_matches_workdir(config, str(tmp_path))
  assert list(tmp_path.iterdir()) == []  # checking alone writes nothing
  run_dir.write_config(config, str(tmp_path))
  saved = json.loads((tmp_path / "config.json").read_text())
  assert saved == checkpointing.json_config(config)
  run_dir.check_config_matches_workdir(config, str(tmp_path))  # same config: accepted

  config.model.embed_dim = config.model.embed_dim + 1
  with pytest.raises(checkpointing.CheckpointMismatchError, match="model.embed_dim") as error:
    run_dir.check_config_matches_workdir(config, str(tmp_path))
  assert "\n" not in str(error.value)
  assert json.loads((tmp_path / "config.json").read_text()) == saved


def test_memory_only_model_keys_may_change_on_resume(tmp_path):
  """Remat changes what a step keeps in memory, not what it computes: a run
  resumes with other values, and a config.json written before the keys
  existed still matches."""
  config = small_config()
  run_dir.write_config(config, str(tmp_path))
  config.model.image_remat = "full"
  config.model.text_remat = "dots_saveable"
  run_dir.check_config_matches_workdir(config, str(tmp_path))
  saved = json.loads((tmp_path / "config.json").read_text())
  for key in run_dir.MEMORY_ONLY_MODEL_KEYS:
    del saved["model"][key]
  (tmp_path / "config.json").write_text(json.dumps(saved))
  run_dir.check_config_matches_workdir(config, str(tmp_path))
  config.model.text_variant = "base"  # any other key still counts
  with pytest.raises(checkpointing.CheckpointMismatchError, match="model.text_variant"):
    run_dir.check_config_matches_workdir(config, str(tmp_path))


def test_readers_never_see_a_half_written_config(tmp_path):
  """One thread rewrites config.json 300 times (as process 0 does at every
  start) while this one reads it: every read parses to the whole config.
  Written in place, a read lands on the truncated file within a few
  rewrites (JSONDecodeError), which is how a 2-process run died in CI."""
  config = small_config()
  workdir = str(tmp_path)
  run_dir.write_config(config, workdir)
  expected = checkpointing.json_config(config)
  done = threading.Event()

  def rewrite():
    for _ in range(300):
      run_dir.write_config(config, workdir)
    done.set()

  writer = threading.Thread(target=rewrite)
  writer.start()
  reads = 0
  while not done.is_set():
    assert json.loads((tmp_path / "config.json").read_text()) == expected
    reads += 1
  writer.join()
  assert reads > 0
  assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]  # no temporaries left


def test_a_run_saved_before_locks_and_lora_existed_still_resumes(tmp_path):
  config = small_config()
  run_dir.write_config(config, str(tmp_path))
  path = tmp_path / "config.json"
  saved = json.loads(path.read_text())
  for key in [k for k in saved["model"] if k.startswith("lock_")] + ["lora"]:
    del saved["model"][key]
  path.write_text(json.dumps(saved))
  # Absent keys ran as "off": the same config matches ...
  run_dir.check_config_matches_workdir(config, str(tmp_path))
  # ... and turning one on is a different run.
  for key, value, named in (
    ("model.lora.rank", 4, "model.lora:"),
    ("model.lock_text", True, "model.lock_text:"),
  ):
    changed = small_config(**{key: value})
    with pytest.raises(checkpointing.CheckpointMismatchError, match=named):
      run_dir.check_config_matches_workdir(changed, str(tmp_path))
