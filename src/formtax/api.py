"""The Python API: ``load_model`` / ``from_transformers``, ``generate`` and ``generate_batch``.

Prompts follow one rule in the API and the CLI: a plain string is the user's message, rendered by the model's chat
template (or plainly concatenated where it has none), as ``formtax generate PROMPT`` does; ``raw=True`` (CLI
``--raw``) sends the string exactly as given (a completion prompt, e.g. few-shot text for a base model). A list of
``{"role", "content"}`` messages is always rendered by the chat template.

``answer`` takes a SPEC string, a Constraint, or a native Python type (``constraints.native``: ``int``,
``["yes", "no"]``, ``Literal[...]``, an ``Enum``, ``re.compile(...)``, a Pydantic model, a JSON Schema dict); with a
typed answer ``Result.parsed`` is the Python value (an ``int``, the ``Enum`` member, a model instance).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from formtax.backends import Backend, load_backend
from formtax.constraints.native import as_constraint
from formtax.constraints.spec import Constraint
from formtax.decoding.engine import Capability
from formtax.decoding.sampling import Sampling, row_seeds
from formtax.errors import ConfigError, ContextLengthError
from formtax.strategies import Request, Result, get_strategy
from formtax.strategies.base import Prompt, Strategy


def load_model(model: Any = None, backend: str = "hf", device: str = "cpu", dtype: str = "float32",
               tokenizer: Any = None, **options: Any) -> Backend:
    """Load a model: the embedded default (None), a .gguf file, a local folder or a hub id; or wrap an already
    loaded ``transformers`` model (with its ``tokenizer``, see :func:`from_transformers`) or a Backend.
    ``options``: the backend's own (hf: ``revision``, ``attn_implementation``, ``trust_remote_code``, ...)."""
    if isinstance(model, Backend):
        return model
    if model is None or isinstance(model, str):
        return load_backend(backend, model, device=device, dtype=dtype, **options)
    return from_transformers(model, tokenizer)


def from_transformers(model: Any, tokenizer: Any, model_id: str | None = None) -> Backend:
    """A backend over a loaded ``transformers`` causal LM and its tokenizer, on the model's own device and dtype
    (nothing is copied or converted)."""
    if not (hasattr(model, "forward") and hasattr(model, "get_output_embeddings") and hasattr(model, "config")):
        raise ConfigError(f"from_transformers needs a transformers causal LM (e.g. AutoModelForCausalLM), got "
                          f"{type(model).__name__}")
    if tokenizer is None or not callable(getattr(tokenizer, "encode", None)):
        raise ConfigError("from_transformers needs the model's tokenizer too: from_transformers(model, tokenizer) "
                          "(AutoTokenizer.from_pretrained(...))")
    from formtax.backends.hf import HFBackend

    name = model_id or str(getattr(model.config, "name_or_path", "") or type(model).__name__)
    return HFBackend(model, tokenizer, name, device=getattr(model, "device", "cpu"))


def _backend(model: Any) -> Backend:
    if isinstance(model, Backend):
        return model
    raise ConfigError(f"generate needs a formtax model (formtax.load_model(...), or formtax.from_transformers(model, "
                      f"tokenizer) for a loaded transformers model), got {type(model).__name__}")


def _prompt(prompt: Prompt, raw: bool) -> Prompt:
    if isinstance(prompt, str) and not raw:
        return [{"role": "user", "content": prompt}]
    if not isinstance(prompt, (str, list)):
        raise ConfigError(f"a prompt is a string or a list of chat messages, got {type(prompt).__name__}")
    if isinstance(prompt, list):
        for k, m in enumerate(prompt):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise ConfigError(f"chat message {k} needs a 'role' and a string 'content', got {m!r}"[:300])
    return prompt


def _prompts(prompts: Any) -> list[Prompt]:
    """The batch's prompts: a list (of strings or of message lists); a lone string is refused, since iterating it
    would run one prompt per character."""
    if isinstance(prompts, str):
        raise ConfigError("generate_batch takes a list of prompts, got one string; pass [prompt], or call generate")
    if isinstance(prompts, dict):
        raise ConfigError("generate_batch takes a list of prompts, got one chat message; pass [[message]]")
    return list(prompts)


def typed_result(res: Result, constraint: Constraint | None) -> Result:
    """Turn ``res.parsed`` into the answer's Python type; a value the type refuses leaves the answer unparsed."""
    if constraint is None or constraint.converter is None or not res.parse_ok:
        return res
    try:
        res.parsed = constraint.to_python(res.parsed)
    except (ValueError, TypeError, KeyError) as e:  # pydantic's ValidationError is a ValueError
        res.parse_ok, res.parsed = False, None
        errors = getattr(e, "errors", None)
        detail = errors()[0].get("msg", str(e)) if callable(errors) and errors() else (str(e) or repr(e))
        res.parse_error = f"not a valid {constraint.python_type}: {detail.splitlines()[0]}"
    return res


def generate_batch(
    model: Backend,
    prompts: Sequence[Prompt],
    strategy: str = "free",
    answer: Any = None,
    max_tokens: int = 256,
    reasoning: str | None = None,
    triggers: Sequence[str] = (),
    seed: int | None = None,
    constrain: bool = True,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
    model_defaults: bool = False,
    raw: bool = False,
    closing: bool | None = None,
    **options: Any,
) -> list[Result]:
    """Generate for several prompts in one batch with one strategy and answer constraint.

    Sampling: ``temperature`` (0 = greedy), ``top_p``, ``top_k``, ``min_p`` (applied to the constrained
    distribution); ``model_defaults=True`` takes all four from the model's own generation_config instead.
    ``raw``: send string prompts without the chat template (module docstring). ``closing``: a constrained answer always
    finishes inside ``max_tokens`` (constraints/closing.py); a request where no completion fits is refused. It
    applies to constrained, json, inwriting and nl2format. Default (None): on wherever formtax steps the model
    (transformers, the fake backend, vLLM through formtax's logits processor, the plugin in a stock ``vllm serve``):
    one default on every route (issue 57); off on OpenAI-compatible servers, which cannot close (True is refused).
    ``options``: the strategy's own settings, named by its options model (:mod:`formtax.strategies.options`;
    the same names as ``formtax generate``'s flags): ``json_layout="compact"`` for json, ``tau`` / ``rule`` for
    the suffix strategies, ``fem`` / ``gamma`` / ``top_k`` / ... for decog and ctrlg. A name the strategy does not
    take is refused before any model call.
    """
    backend = _backend(model)
    strat = get_strategy(strategy)
    constraint = as_constraint(answer) if answer is not None else None
    reqs = requests_of(backend, prompts, constraint, max_tokens, reasoning, triggers, seed, constrain,
                       Sampling(temperature, top_p, top_k, min_p), model_defaults, raw, closing, options)
    check_context(backend, reqs)
    return finish_results(backend, strat, reqs, strat.run(backend, reqs))


def requests_of(backend: Backend, prompts: Sequence[Prompt], constraint: Constraint | None, max_tokens: int,
                reasoning: str | None, triggers: Sequence[str], seed: int | None, constrain: bool, sampling: Sampling,
                model_defaults: bool, raw: bool, closing: bool | None, options: dict[str, Any]) -> list[Request]:
    """The strategy requests of :func:`generate_batch` (shared with the server's batches, which decode them
    under their own hooks)."""
    sampling = resolve_sampling(backend, sampling, model_defaults)
    closing = resolve_closing(backend, closing)
    listed = _prompts(prompts)
    return [
        Request(_prompt(p, raw), constraint, max_tokens=max_tokens, seed=s, reasoning_prefix=reasoning,
                triggers=triggers, constrain=constrain, temperature=sampling.temperature, top_p=sampling.top_p,
                top_k=sampling.top_k, min_p=sampling.min_p, closing=closing, options=dict(options))
        for p, s in zip(listed, row_seeds(seed, len(listed)), strict=True)
    ]


def finish_results(backend: Backend, strat: Strategy, reqs: Sequence[Request], results: Sequence[Result]
                   ) -> list[Result]:
    """Typed answers, and whether closing mode was in effect (its default depends on the backend)."""
    out = [typed_result(r, reqs[0].constraint) for r in results]
    for r, q in zip(out, reqs, strict=False):
        if q.temperature > 0:  # the seed the row drew with (fresh when none was given): enough to reproduce it
            r.stats["seed"] = q.seed
    if reqs and reqs[0].constraint is not None and reqs[0].constrain:
        for r in out:
            r.stats.setdefault("closing", closing_applied(backend, strat, reqs[0]))
    return out


def closing_applied(backend: Backend, strat: Strategy, req: Request) -> bool:
    """Whether closing mode was in effect for a constrained request (``Result.stats["closing"]``, which the API,
    the server and the runner's records report alike)."""
    return req.closing and strat.closing_target(backend, req) is not None


def check_context(backend: Backend, reqs: Sequence[Request]) -> None:
    """Refuse, before any model call, a prompt whose tokens plus ``max_tokens`` exceed the model's context
    (:class:`~formtax.errors.ContextLengthError`, one line with the numbers, as OpenAI words it). A prompt whose
    length alone proves it (``TokenizerInfo.fewest_tokens``) is refused without tokenizing it."""
    limit = backend.context_length
    if limit is None:
        return
    for r in reqs:
        floor = backend.tokenizer.fewest_tokens(r.prompt)  # a prompt of megabytes is refused untokenized
        if floor + r.max_tokens > limit:
            raise ContextLengthError(limit, floor, r.max_tokens, at_least=True)
        n = len(backend.tokenizer.prompt_ids(r.prompt))
        if n + r.max_tokens > limit:
            raise ContextLengthError(limit, n, r.max_tokens)


def parse(text: str, answer: Any, strategy: str = "constrained", finish_reason: str = "") -> Result:
    """Read the answer out of a text that ``strategy`` wrote for ``answer`` (a SPEC string or a constraint):
    a vLLM client's text from formtax's plugin, a stored output. Returns a Result with ``parsed``, ``parse_ok``,
    ``parse_error``, ``answer_text`` and ``reasoning`` filled by the same reader as every Result formtax decodes
    (strategies/reading.py); InWriting's answer is the part after the line break where it begins.

        r = formtax.parse(text, "The answer is: {int}", strategy="inwriting")
        r.parsed  # 7
    """
    from formtax.constraints.native import as_constraint
    from formtax.strategies.reading import parse_text

    return parse_text(text, None if answer is None else as_constraint(answer), strategy, finish_reason)


def closing_default(capabilities: frozenset[Capability]) -> bool:
    """Closing mode's default for an engine of these capabilities: on wherever formtax has the logits of every
    step, on every route (generate, the runner, formtax serve, the vLLM plugin: issues 56 and 57)."""
    return Capability.STEP_LOGITS in capabilities


def resolve_closing(model: Backend, closing: bool | None) -> bool:
    """Closing mode's setting for this backend (see :func:`generate_batch`)."""
    steps = closing_default(model.capabilities)
    if closing is None:
        return steps
    if closing and not steps:
        raise ConfigError(f"closing mode needs the logits of every step, which backend {model.name!r} does not "
                          "expose; pass closing=False")
    return closing


def resolve_sampling(model: Backend, sampling: Sampling, model_defaults: bool) -> Sampling:
    """``sampling``, or the model's own defaults when asked (refused if the backend does not know them)."""
    if not model_defaults:
        return sampling
    defaults = model.generation_defaults()
    if defaults is None:
        raise ConfigError(f"backend {model.name!r} does not know its model's generation defaults; give the "
                          "sampling settings instead")
    return defaults


async def agenerate(model: Backend, prompt: Prompt, strategy: str = "free", answer: Any = None,
                    **kwargs: Any) -> Result:
    """:func:`generate` for asyncio code: decoding runs in a worker thread, so the event loop stays free.

    Thread safety (tested in tests/core/test_api_promises.py): calls on one model from several threads (or
    concurrent ``agenerate`` tasks) are safe and give what sequential calls give, token for token. Each call has
    its own grammar matchers, KV cache and generators; the weights are only read, and the compiled-grammar and
    witness caches are locked LRU maps. They share the CPU, so they do not run faster than one batch
    (:func:`generate_batch` is the fast way to decode many prompts)."""
    import asyncio

    return await asyncio.to_thread(generate, model, prompt, strategy, answer, **kwargs)


def generate(
    model: Backend,
    prompt: Prompt,
    strategy: str = "free",
    answer: Any = None,
    max_tokens: int = 256,
    reasoning: str | None = None,
    triggers: Sequence[str] = (),
    seed: int | None = None,
    constrain: bool = True,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    min_p: float = 0.0,
    model_defaults: bool = False,
    raw: bool = False,
    closing: bool | None = None,
    **options: Any,
) -> Result:
    """Generate one output (see :func:`generate_batch` and the module docstring for prompts and answers)."""
    return generate_batch(model, [prompt], strategy, answer, max_tokens, reasoning, triggers, seed, constrain,
                          temperature, top_p, top_k, min_p, model_defaults, raw, closing, **options)[0]
