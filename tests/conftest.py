"""Test session set-up: 8 virtual CPU devices for the sharding tests."""
import os

# Must happen before jax is imported anywhere: the 1-device vs 8-device tests
# build meshes over these virtual devices.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
