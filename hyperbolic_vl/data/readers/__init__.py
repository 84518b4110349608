"""Random-access readers of files on disk (CSV, TFDS ArrayRecord, tar shards,
HierarCaps CSVs, object boxes), used by the registered data sources."""
