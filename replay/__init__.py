"""prism.replay: the virtual-peer process group, the co-simulation clock, the replay runtime."""
