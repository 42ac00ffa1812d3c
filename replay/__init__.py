"""prism.replay: run chosen ranks of the full-scale job for real against virtual peers timed by
the graph (the co-simulation clock, the replay runtime, paced captures)."""
