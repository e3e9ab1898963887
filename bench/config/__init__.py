"""Configuration: what a suite is asked to do, checked before anything runs.

- ``spec``: the matched spec's dataclasses (one budget every method's config derives from), each field documented;
- ``rules``: the value rules (``SPEC_RULES``), the cross-field checks and a sweep's checks (``validate``);
- ``loading``: shipped presets (``presets/*.yaml``), ``extends:`` chains, dotted overrides, ``load_spec``;
- ``sweep``: a sweep's axes expanded into points (ids, point data); ``launcher``: accelerate / DeepSpeed settings
  and their checks; ``architectures``: the shipped real-model configs (``architectures/*.json``);
- ``registry``: run name -> recipe import path (the one place ``bench`` learns about ``baselines``).

May import: the contracts (``bench.errors``, ``bench.results``) only. No torch.
"""
