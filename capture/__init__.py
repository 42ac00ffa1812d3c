"""prism.capture: run a slice of a training job and record its traces."""
