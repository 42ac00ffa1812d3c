"""prism.graph.export: the graph in the formats other tools read (Chrome/Perfetto traces)."""
