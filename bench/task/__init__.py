"""The task: problems, splits, prompts and how an answer is judged.

- ``problems``: the synthetic arithmetic task and GSM8K files (``question`` / ``answer`` ending in ``#### N``);
- ``data``: the held-out splits and the matched rows every method trains and is evaluated on;
- ``prompts``: evaluation prompt styles, the answer-format tags and the chat-template rendering;
- ``verifier``: number normalisation and answer extraction (the suite's modes and lm-eval's), correctness;
- ``rewards``: the rule rewards (accuracy, format, length penalty); ``lengths``: max lengths from the data;
- ``export``: the splits written out as files (``bench data export``).

May import: ``bench.config`` and the contracts. Pure Python: the verifier and rewards import no torch (a tokenizer
is passed in where one is needed).
"""
