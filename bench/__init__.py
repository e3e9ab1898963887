"""bench: the measuring machine of the PPO / DPO / GRPO benchmarking suite."""

__version__ = "0.1.0"
