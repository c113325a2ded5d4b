"""The built-in strategies by name: module and one-line summary, without importing them.

Why a second list beside the ``@register`` registry: ``formtax ls strategies`` and ``--help`` must answer in well
under a second, and importing a strategy module loads torch and llguidance (several seconds). The registry stays
the source of truth; ``tests/core/test_cli_fast.py`` fails when this catalog and the registered classes differ.
"""

from __future__ import annotations

CATALOG: dict[str, tuple[str, str]] = {
    'constrained': ('formtax.strategies.basic',
        'the answer constraint from the first token (constrained greedy; no free reasoning)'),
    'ctrlg': ('formtax.strategies.decog',
        'Ctrl-G: like decog with an HMM distilled from unconditional samples, full state space (needs --fem)'),
    'decog': ('formtax.strategies.decog',
        'Deco-G: free reasoning reweighted by an instruction-aware HMM + token DFA of the answer template (top-k state pruning, gamma; needs --fem); 100% format compliance'),
    'free': ('formtax.strategies.basic',
        'unconstrained greedy (or sampled) decoding to EOS or the budget; the answer is read from the text'),
    'inwriting': ('formtax.strategies.inwriting',
        'free preamble (EOS masked), then the constraint when the model wants to stop or a trigger appears'),
    'json': ('formtax.strategies.basic',
        'one JSON object {"reason": free text, "answer": typed answer}, constrained throughout'),
    'nl2format': ('formtax.strategies.nl2format',
        'call 1: free reasoning; call 2: a conversion prompt decoded with the answer constraint'),
    'short': ('formtax.strategies.basic',
        'unconstrained, stopped at the first token containing a newline; the line is the answer'),
    'suffix-beam': ('formtax.strategies.suffix',
        'the step-synchronous beam of 2 (free + constrained hypothesis; rule last or min), run as a beam'),
    'suffix-last': ('formtax.strategies.suffix',
        'free greedy, then the template from the latest step whose bifurcation penalty is <= tau (default 0)'),
    'suffix-min': ('formtax.strategies.suffix',
        'free greedy, then the template from the step of minimal bifurcation penalty (ties: the latest)'),
    'suffix-pipeline': ('formtax.strategies.suffix',
        "free greedy to EOS or the budget, then the answer template appended (paper 000's pipeline)"),
}


def list_catalog() -> dict[str, str]:
    """name -> summary of every built-in strategy, sorted by name."""
    return {name: summary for name, (_, summary) in sorted(CATALOG.items())}
