"""What a run leaves on disk: Orbax checkpoints and restore, the workdir
(its lock, saved config, provenance) and metrics files."""
