"""Models: loading and building the networks and tokenizers, the precision policy, the generation settings.

- ``loading``: the tiny random-init model and its tokenizer, shipped architectures with random weights, hub ids and
  local folders, the reward model's sequence classifier, the device;
- ``precision``: which network is stored and computed in which dtype (fp32 masters, bf16 autocast, frozen bf16);
- ``generation``: one explicit generation configuration built from the spec for every generation.

May import: ``bench.task``, ``bench.config`` and the contracts.
"""
