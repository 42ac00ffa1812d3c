"""prism.graph: from captured traces to the full-scale execution graph and its simulation.

Sub-packages, each one concern:

- ``prism.graph.traces``: read Kineto traces and Execution Traces (ops, marks, memory events).
- ``prism.graph.build``: normalize a capture into op tables, cut them into block templates,
  compose each stage's program and bind it to every target rank (``prism-build-graph``).
- ``prism.graph.comm``: the α-β communication model, where groups sit on nodes, and its
  calibration on this machine (``prism-calibrate``).
- ``prism.graph.sim``: the discrete-event simulation of a graph, what-ifs, predictions
  (``prism-simulate``).
- ``prism.graph.io``: write, read and validate ``graph.parquet`` (``prism-validate-graph``).

Dependencies run io, comm <- sim <- build (traces is read by build only); the replay uses the
simulation, the file format and the trace readers.
"""
