"""Telemetry: static memory accounting, labelled memory readings, phase/step timers, TRL hooks.

Every memory number carries its source (``cuda-allocated``, ``cuda-reserved``, ``nvml-device``,
``nvml-process``, ``cpu-rss``); a source that is not available on this machine is absent, never 0.
:class:`ParamSnapshot` compares the trained weights before and after training (did training move them?).
``monitors`` holds the reward-hacking and training-dynamics monitors (per-step rates, the run's flags).

May import: ``bench.scoring``, ``bench.model``, ``bench.task``, ``bench.config`` and the contracts. Nothing here
imports torch at module level.
"""

from bench.telemetry.accounting import account_networks
from bench.telemetry.environment import capture_environment
from bench.telemetry.memory import primary_source
from bench.telemetry.param_change import ParamSnapshot
from bench.telemetry.tracker import Telemetry
from bench.telemetry.trl_hooks import instrument_trl_trainer

__all__ = ["ParamSnapshot", "Telemetry", "account_networks", "capture_environment", "instrument_trl_trainer",
           "primary_source"]
