"""formtax inside other stacks: a transformers ``LogitsProcessor`` (vLLM's form is ``backends.vllm.logits_processor``)."""
