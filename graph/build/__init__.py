"""Build graph.parquet from a capture: op tables, block templates, stage programs bound to every rank."""
