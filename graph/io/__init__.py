"""graph.parquet on disk: write and read it (``prism.graph.io.parquet``), validate it."""
