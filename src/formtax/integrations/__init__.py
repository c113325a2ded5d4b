"""formtax inside other stacks: a transformers ``LogitsProcessor`` (vLLM's form is ``backends.logits_processor``)."""
