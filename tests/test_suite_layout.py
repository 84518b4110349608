"""The suite's own layout under pytest-xdist: tests marked to share a
worker (`shared_runs.ON_ONE_WORKER`, `--dist=loadgroup` from pyproject's
addopts) are renamed `<id>@<group>`, which is how xdist keeps them on one
worker. A pytest whose node ids ignore the rename (9.2 with xdist 3.8)
would spread them over the workers, each then waiting idle for a shared run
another is training."""

import pytest
import shared_runs


@shared_runs.ON_ONE_WORKER
def test_grouped_tests_carry_their_group(request):
  if not getattr(request.config.option, "loadgroup", False):
    pytest.skip("not on a pytest-xdist worker with --dist=loadgroup")
  assert request.node.nodeid.endswith("@shared_runs"), request.node.nodeid
