"""Read the captured traces: Kineto Chrome traces, Execution Traces, the allocator's memory events."""
