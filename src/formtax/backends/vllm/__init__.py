"""formtax's vLLM engine, one package (optional extra ``formtax[vllm]``), as vLLM keeps each of its
structured-output backends in one place:

* :mod:`~formtax.backends.vllm.backend`: the backend (``--backend vllm``), a ``RowEngine`` on an in-process
  ``vllm.LLM``; :mod:`~formtax.backends.vllm.async_engine`: vLLM's async engine for ``formtax serve``;
* :mod:`~formtax.backends.vllm.plugin`: the logits processor vLLM loads in its engine (formtax's backend
  hands it this module's path; a stock ``vllm serve`` loads it as
  ``formtax.vllm_plugin:FormtaxLogitsProcessor``), with :mod:`~formtax.backends.vllm.logits_processor` (the
  rows it steps) and :mod:`~formtax.backends.vllm.rows` (a stock server's rows, built from a strategy's name);
* :mod:`~formtax.backends.vllm.row_reports`: the sealed recipes and the reports between backend and plugin.

The package sits a layer above the strategies (the plugin builds their rows inside the engine) and below the
engines' registry (tests/architecture/test_import_layers.py). vLLM is imported only where it is used.
"""
