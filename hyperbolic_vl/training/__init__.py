"""The trainer: set-up, the sharded step and the loop, with the optimizer,
sharding, pre-emption and health checks beside them. Imported only by the
entry points (`main.py`), the tools and `benchmarks/`."""
