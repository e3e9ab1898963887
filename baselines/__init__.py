"""baselines: the contestants, one readable recipe per method (see bench.config.registry)."""
