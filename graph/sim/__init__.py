"""Simulate a graph: the discrete-event engine, arrival skew, folding of replicas, what-ifs, predictions."""
