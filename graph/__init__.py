"""prism.graph: normalize traces, slice them into blocks, extrapolate the full-scale graph."""
