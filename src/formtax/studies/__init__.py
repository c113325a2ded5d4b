"""Studies: each folder holds one study's task, scoring and analyses together (inspect's Task = dataset + solver
+ scorer, with the report's analyses beside them), plugged into the generic registries by name:

- :mod:`~formtax.studies.abstention`: tool-call abstention on MetaTool (paper 002).
- :mod:`~formtax.studies.eae`: event argument extraction on WikiEvents / GENEVA / ACE05 (paper 001).
- :mod:`~formtax.studies.summeval`: SummEval's LLM-as-judge ratings (paper 001).

The task registry (:data:`formtax.tasks.registry.BUILTIN_MODULES`) and the report's analysis registry
(:data:`formtax.report.analyses.BUILTIN_MODULES`) name these modules by path; nothing beneath imports a study.
"""
