"""Systems: what a method costs before it runs, and the GPU check.

- ``memory_model``: the analytical memory model (weights, gradients, optimizer, activations, KV cache, logits)
  per phase of each method, from an architecture's config alone;
- ``estimate``: ``bench estimate`` over the memory model (fits, largest size, the never-fits reasons);
- ``gpu_check_plan``, ``gpu_check_table``, ``gpu_check_telemetry``: ``scripts/gpu_check.sh``'s steps and table.

May import: ``bench.report`` (result loading, the scaling tables), ``bench.telemetry`` and every layer below.
"""
