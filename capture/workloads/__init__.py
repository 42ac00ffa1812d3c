"""Built-in reference workloads."""
