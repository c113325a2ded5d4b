"""The project's error types.

Every error a user can cause carries a message that names the problem (the bad regex, the missing file, the
strategy a backend cannot run), so the CLI can print it without a traceback.
"""


class FormtaxError(Exception):
    """Base class of every error formtax raises on purpose."""


class ConstraintError(FormtaxError):
    """An invalid constraint: a bad regex, JSON schema, template slot or Lark grammar."""


class CapabilityError(FormtaxError):
    """A strategy needs something the backend does not provide."""


class DataError(FormtaxError):
    """A data file is missing or malformed."""


class ConfigError(FormtaxError):
    """An invalid configuration: unknown name, mismatched run directory, bad option."""


class ContextLengthError(ConfigError):
    """A prompt plus its token budget exceeds the model's context (refused before any model call; the server
    answers it with OpenAI's ``context_length_exceeded``)."""

    def __init__(self, limit: int, prompt: int, completion: int, at_least: bool = False) -> None:
        more = "at least " if at_least else ""
        super().__init__(f"this model's maximum context length is {limit} tokens, but {more}{prompt + completion} "
                         f"were requested ({more}{prompt} in the prompt, {completion} for the completion); shorten "
                         "the prompt or lower max_tokens")
        self.limit, self.prompt, self.completion = limit, prompt, completion
