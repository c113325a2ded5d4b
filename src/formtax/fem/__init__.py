"""The format estimation module (FEM) of Deco-G and Ctrl-G (paper 001; docs/ALGORITHMS.md section 7).

- :mod:`~formtax.fem.automata`: byte-level regex combinators -> minimal DFAs (integer ranges, slots, phrases).
- :mod:`~formtax.fem.dfa`: the flexible trie: a template -> a minimal token-level DFA with a dead sink.
- :mod:`~formtax.fem.hmm`: the HMM (pi, A, B), its forward update, initialisation and Baum-Welch.
- :mod:`~formtax.fem.reweight`: backward tables, the per-step reweighting (with top-k state pruning) and the
  decode-loop policy with its hard mask.
- distillation from the model lives in :mod:`formtax.runner.distill` (it runs a backend over a task: above this layer).
- :mod:`~formtax.fem.artifact`: the versioned ``.npz`` + ``.json`` artifact.

The strategies ``decog`` and ``ctrlg`` live in :mod:`formtax.strategies.decog`; ``formtax fem build`` in
:mod:`formtax.cli.fem`.
"""

from formtax.fem.artifact import FEM_VERSION, FemArtifact, load_fem, save_fem
from formtax.fem.dfa import FormatSpec, TokenDFA, TokenVocab, build_token_dfa, token_dfa, vocab_for
from formtax.fem.hmm import HMM
from formtax.fem.reweight import FemPolicy, FemRuntime, backward_tables

__all__ = [
    "FEM_VERSION",
    "HMM",
    "FemArtifact",
    "FemPolicy",
    "FemRuntime",
    "FormatSpec",
    "TokenDFA",
    "TokenVocab",
    "backward_tables",
    "build_token_dfa",
    "load_fem",
    "save_fem",
    "token_dfa",
    "vocab_for",
]
