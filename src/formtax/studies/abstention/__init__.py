"""Tool-call abstention (paper 002) on MetaTool Task 2.

- ``task``: the benchmark (items, translations, prompts) and its mention-rule reading of an output;
- ``scoring``: the deterministic mention rules (no LLM judge);
- ``frame``: which records form the three conditions, re-scored, as position x seed matrices;
- ``tables``, ``language``: paper 002's tables and figure; ``extra``: its remaining analyses;
- ``analyses``: their registration with the report.
"""
