"""Studies: each folder holds one study's task, scoring and analyses together (inspect's Task = dataset + solver
+ scorer, with the report's analyses beside them), plugged into the generic registries by name:

- :mod:`~formtax.studies.abstention`: tool-call abstention on MetaTool (paper 002).
- :mod:`~formtax.studies.eae`: event argument extraction on WikiEvents / GENEVA / ACE05 (paper 001).
- :mod:`~formtax.studies.summeval`: SummEval's LLM-as-judge ratings (paper 001).

The task catalog (:mod:`formtax.tasks.catalog`) imports the studies' tasks and the report's analysis catalog
(:mod:`formtax.report.catalog`) their analyses; each catalog sits above what it imports in the layer order
(tests/architecture/test_import_layers.py), and nothing names a study's module by string.
"""
