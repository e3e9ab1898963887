"""Models: loading and building the networks and tokenizers, the precision policy, the generation settings.

- ``loading``: the tiny random-init model and its tokenizer, shipped architectures with random weights, hub ids and
  local folders, the reward model's sequence classifier, the device;
- ``precision``: which network is stored and computed in which dtype (fp32 masters, bf16 autocast, frozen bf16);
- ``numerics``: one compute numerics whatever the storage (a bf16-stored network under autocast computes as its
  float32 copy), the evaluation numerics every policy is scored in, and its record;
- ``generation``: one explicit generation configuration built from the spec for every generation.

May import: ``bench.task``, ``bench.config`` and the contracts.
"""
