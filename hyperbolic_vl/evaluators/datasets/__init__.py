"""Evaluation data readers: the run's own held-out split (through the data
registry), real benchmarks (TFDS, image folders, CSV) and their metadata."""
