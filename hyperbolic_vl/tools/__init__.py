"""Measuring commands: training-step and input-pipeline throughput."""
