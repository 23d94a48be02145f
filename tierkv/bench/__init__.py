"""Measurements: synthetic KV workloads shaped like real models, and the benchmark runners."""
