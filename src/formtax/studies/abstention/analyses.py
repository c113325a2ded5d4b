"""The tool-abstention study's analyses, registered with the report (``formtax.report.analyses``) so that
``formtax report`` writes and ``formtax verify`` regenerates and checks every number (paper 002's remaining
analyses are in :mod:`formtax.studies.abstention.extra`).
"""

from __future__ import annotations

from formtax.report.analyses import Analysis, register_analysis
from formtax.studies.abstention.language import language_table
from formtax.studies.abstention.tables import (
    accuracy_table,
    contrasts_table,
    fit_table,
    mass_figure,
    mass_table,
    seeds_table,
    transitions_table,
)

_BOOT = "95% percentile bootstrap, positions and seeds resampled jointly"


register_analysis(
    Analysis(
        name="abstention_accuracy",
        keys=("task", "language", "strategy"),
        description=(
            "Paper 002 Table 1 (tool abstention, MetaTool Task 2): accuracy on abstention items (gold None) "
            "and on tool-needed items (gold = the listed tool) per language and condition, scored by the "
            "deterministic mention rules (no LLM judge). Beside them, the outcome counts over scored "
            "outputs: D0 = no readable answer (no candidate, no None), D2 = two or more candidates named "
            "(wrong, counted apart), wrong = a readable single wrong answer, order = the gold is present "
            "but refused by the ordering rule. Absolute levels are context only: the design licenses claims "
            "about the differences (abstention_contrasts). pooled_acc = over both item types (paper 002's "
            "pooled table, section 4.1), the items of both types resampled as units."
        ),
        method=_BOOT + "; Wilson on positions where every score is 0 or every score is 1 (a bootstrap point there)",
        bootstrap=True,
        compute=accuracy_table,
    )
)


register_analysis(
    Analysis(
        name="abstention_contrasts",
        keys=("task", "language", "item_type", "contrast"),
        description=(
            "Paper 002 Table 3: delta_mask = constrained - short (the grammar alone), delta_length = short - "
            "free (the stop at the first newline), delta_total = constrained - free (what a two-condition "
            "design reports), per language and item type, on the positions scored in all three conditions. "
            "Every replicate draws one set of positions and seeds for all three cells, so delta_total = "
            "delta_mask + delta_length within each replicate (the interval ends need not add)."
        ),
        method=_BOOT + ", paired across cells; below 20 positions the exact Clopper-Pearson box on the discordant "
        "positions (formtax.stats.exact), and where every position differs alike (e.g. no position differs) the "
        "Wilson boundary interval (formtax.stats.paired_boundary_interval), as the paired table",
        bootstrap=True,
        compute=contrasts_table,
    )
)


register_analysis(
    Analysis(
        name="abstention_transitions",
        keys=("task", "language", "item_type", "direction", "short_category"),
        description=(
            "Over (position, seed) pairs scored under short and constrained: for the outputs the constraint "
            "turned from wrong to right, what the short output had been (D0 = no readable answer, wrong = a "
            "readable wrong answer, D2 = several candidates, order = correct but refused by the ordering "
            "rule); and how many it turned from right to wrong. share = the category's share of its "
            "direction; n_short_abstained = how many of those short outputs contained None. Repair shows as "
            "D0 dominating wrong_to_right."
        ),
        method="none (counts)",
        bootstrap=False,
        compute=transitions_table,
    )
)


register_analysis(
    Analysis(
        name="abstention_mass",
        keys=("task", "item_id"),
        description=(
            "Per item, from the short condition's first token (no mask applied): masked_mass = the exact "
            "probability outside the tokens that can begin an allowed answer (each candidate name or None, "
            "bare or space-prefixed); masked_mass_topk = the same summed over the top-20 tokens only, the "
            "lower bound a server returning top-20 log-probs would give, with topk_coverage = the mass of "
            "those 20; grammar_masked_mass = the mass outside the grammar engine's allowed first tokens, "
            "recorded by the constrained condition on the same prompt; penalty = constrained - short "
            "accuracy (mean over seeds)."
        ),
        method="none (per-item values; means over seeds)",
        bootstrap=False,
        compute=mass_table,
        figure=mass_figure,
        figure_caption=(
            "Per-item penalty (constrained - short accuracy) against the short condition's first-token "
            "masked_mass; colour = item type, marker = language; small vertical jitter."
        ),
    )
)


register_analysis(
    Analysis(
        name="abstention_mass_fit",
        keys=("task", "language", "item_type"),
        description=(
            "EXPLORATORY, not registered: logistic fit (statsmodels) of P(flip) on masked_mass, over the "
            "outputs short got right; flip = the constrained output is wrong. Units are items when every "
            "item's outcome is the same across seeds (seeds would only repeat it), otherwise item x seed. "
            "status other than ok means the maximum-likelihood fit does not exist (e.g. no flips). The "
            "coverage columns summarise the top-20 bound: bound_gap = exact - top-20 masked mass per item."
        ),
        method="Wald standard errors and p-values from the logistic fit (descriptive)",
        bootstrap=False,
        compute=fit_table,
    )
)


register_analysis(
    Analysis(
        name="abstention_language",
        keys=("task", "language_1", "language_2", "item_type"),
        description=(
            "Second language (query translated, every other prompt byte identical): over (position, seed) "
            "pairs, S = pairs both languages answered correctly under short; b = those only language 2 lost "
            "under the constraint, c = those only language 1 lost; D_paired = (b - c)/|S|. delta_mask_diff = "
            "delta_mask of language 2 - delta_mask of language 1, on the same positions. Replicates with |S| "
            "= 0 are undefined and left out of the interval (n_replicates_undefined). delta_length_diff and "
            "delta_total_diff are the same language differences of the other two contrasts (on the positions "
            "scored in all six cells; empty without the free condition). Only positions both "
            "languages cover are paired: n_positions_only_1 / _2 count those one language has alone (a "
            "translation's exclusions, each with its reason in the manifest's task_notes)."
        ),
        method=_BOOT + ", the same draw for both languages",
        bootstrap=True,
        compute=language_table,
    )
)


register_analysis(
    Analysis(
        name="abstention_seeds",
        keys=("task", "strategy"),
        description=(
            "Whether outputs differ across decoding seeds: at temperature 0 decoding is greedy and "
            "in-process, so a seed should change nothing; outputs_differ_across_seeds = no confirms it, and "
            "the seed axis of the intervals then only repeats each item (the intervals are those of the "
            "items)."
        ),
        method="none (counts)",
        bootstrap=False,
        compute=seeds_table,
    )
)
