"""Strategy options: each strategy declares its settings as a pydantic model, and everything else reads it.

``Request.options`` holds them; :func:`check_options` validates a dict against the strategy's model (an unknown
key or a bad value is a one-line ConfigError before any model call); ``formtax generate``'s strategy flags are
generated from the fields here (:func:`add_option_args`, one flag per field name, shared by the strategies that
declare it), and ``formtax.generate(..., **options)`` takes the same names as keyword arguments: one code path.

This module imports pydantic only, so the CLI builds its parser without loading torch (``formtax --help`` stays
fast). Each model names the strategies that use it (``strategies``); a strategy class points at its model
(``Strategy.Options``), and ``tests/core/test_strategy_options.py`` checks that the two agree.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from formtax.errors import ConfigError


class StrategyOptions(BaseModel):
    """No options (the default of every strategy)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    strategies: ClassVar[tuple[str, ...]] = ()


class SuffixOptions(StrategyOptions):
    """The suffix strategies' branching threshold."""

    strategies: ClassVar[tuple[str, ...]] = ("suffix-pipeline", "suffix-last", "suffix-min", "suffix-beam")
    tau: float = Field(0.0, description="branch where the bifurcation penalty is <= TAU (default 0)")

    @field_validator("tau", mode="before")
    @classmethod
    def _tau(cls, v: Any) -> float:
        try:
            tau = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"tau must be a number, got {v!r}") from None
        if not tau >= 0.0 or math.isinf(tau):
            raise ValueError(f"tau must be a finite number >= 0, got {tau}")
        return tau


class SuffixBeamOptions(SuffixOptions):
    """suffix-beam also takes the rule that picks the branch replacing its constrained hypothesis."""

    strategies: ClassVar[tuple[str, ...]] = ("suffix-beam",)
    rule: Literal["last", "min"] = Field(
        "last", description="which branch replaces the constrained hypothesis (default last)",
        json_schema_extra={"flag": "--beam-rule"})

    @field_validator("rule", mode="before")
    @classmethod
    def _rule(cls, v: Any) -> Any:
        if v not in ("last", "min"):
            raise ValueError(f"unknown beam rule {v!r}; use one of last, min")
        return v


class JsonOptions(StrategyOptions):
    """Paper 003's JSON strategy: where JSON whitespace may go (constraints/jsonreason.py)."""

    strategies: ClassVar[tuple[str, ...]] = ("json",)
    json_layout: Literal["flexible", "compact"] = Field(
        "flexible", description="JSON whitespace wherever a parser allows it (flexible, the default) or compact")

    @field_validator("json_layout", mode="before")
    @classmethod
    def _layout(cls, v: Any) -> Any:
        v = getattr(v, "value", v)  # a JsonLayout member
        if v not in ("flexible", "compact"):
            raise ValueError(f"json_layout must be one of flexible, compact, got {v!r}")
        return v


class FemOptions(StrategyOptions):
    """Deco-G and Ctrl-G (strategies/decog.py interprets the values: defaults per strategy, the spec's extras)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    strategies: ClassVar[tuple[str, ...]] = ("decog", "ctrlg")
    fem: Any = Field(None, description="the HMM artifact (`formtax fem build`), or NAME=FILE,...,OPTION=VALUE",
                     json_schema_extra={"metavar": "FILE"})
    gamma: float | None = Field(None, description="control strength (default 1)")
    # not ``top_k``: that name is the sampler's (formtax.generate(top_k=...)); a --fem spec may still say top_k
    state_top_k: int | str | None = Field(
        None, description="hidden states kept per step, a share (default 5%%, the paper's 200 of 4096) or a number "
                          "(0 = all)")
    placement: Literal["end", "anywhere"] | None = Field(
        None, description="where the answer goes: the last line (end) or anywhere (the key phrase)")
    leading_space: bool | None = Field(None, description="allow a space before the answer (default true)")
    slot_tokens: str | None = Field(None, description="every slot's token range LO..HI")
    allow_form: bool | None = Field(None, description="accept an artifact of the other distillation form")


MODELS: tuple[type[StrategyOptions], ...] = (SuffixOptions, SuffixBeamOptions, JsonOptions, FemOptions)


def options_model(strategy: str) -> type[StrategyOptions]:
    """The options model a strategy name declares (the most specific one; StrategyOptions when none)."""
    found = [m for m in MODELS if strategy in m.strategies]
    return found[-1] if found else StrategyOptions


def flag(name: str, model: type[StrategyOptions]) -> str:
    extra = model.model_fields[name].json_schema_extra
    given = extra.get("flag") if isinstance(extra, dict) else None
    return str(given) if given else "--" + name.replace("_", "-")


def _owners(name: str) -> list[str]:
    return sorted({s for m in MODELS if name in m.model_fields for s in m.strategies})


def check_options(strategy: str, options: Mapping[str, Any], model: type[StrategyOptions] | None = None
                  ) -> StrategyOptions:
    """``options`` validated against the strategy's model; a one-line ConfigError naming the problem."""
    model = model or options_model(strategy)
    for key in options:
        if key not in model.model_fields:
            owners = _owners(key)
            if owners:
                raise ConfigError(f"strategy {strategy!r} takes no {key} option ({flag(key, options_model(owners[0]))} "
                                  f"applies to {', '.join(owners)})")
            known = ", ".join(model.model_fields) or "none"
            raise ConfigError(f"strategy {strategy!r}: unknown option(s) {key}; known: {known}")
    try:
        return model.model_validate(dict(options))
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err.get("loc", ()))
        msg = str(err.get("msg", e)).removeprefix("Value error, ")
        raise ConfigError(f"strategy {strategy!r}: {where}: {msg}") from None


def _literal_choices(ann: Any) -> list[str]:
    """The string values of a ``Literal[...]`` annotation (inside ``X | None`` too); empty for other types."""
    if get_origin(ann) is Literal:
        return [a for a in get_args(ann) if isinstance(a, str)]
    return [c for a in get_args(ann) for c in _literal_choices(a)]


def _parse_bool(text: str) -> bool:
    s = text.strip().lower()
    if s in ("1", "true", "yes", "on"):
        return True
    if s in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_option_args(parser: argparse.ArgumentParser) -> None:
    """One flag per option field (default None: not given), its help naming the strategies that take it."""
    seen: set[str] = set()
    for model in MODELS:
        for name, info in model.model_fields.items():
            if name in seen:
                continue
            seen.add(name)
            kw: dict[str, Any] = {"dest": f"opt_{name}", "default": None,
                                  "help": f"{', '.join(_owners(name))}: {info.description}"}
            ann = info.annotation
            choices = _literal_choices(ann)
            if choices:
                kw["choices"] = choices
            elif ann in (float, float | None):
                kw["type"] = float
            elif ann in (bool, bool | None):
                kw["type"] = _parse_bool
                kw["metavar"] = "true|false"
            extra = info.json_schema_extra
            if isinstance(extra, dict) and "metavar" in extra:
                kw["metavar"] = extra["metavar"]
            parser.add_argument(flag(name, model), **kw)


def options_from_args(args: argparse.Namespace, strategy: str) -> dict[str, Any]:
    """The option flags given on the command line, refused (before the model loads) where ``strategy`` does not
    take them."""
    given = {name: getattr(args, f"opt_{name}") for m in MODELS for name in m.model_fields
             if getattr(args, f"opt_{name}", None) is not None}
    model = options_model(strategy)
    for name in given:
        if name not in model.model_fields:
            raise ConfigError(f"{flag(name, options_model(_owners(name)[0]))} applies to "
                              f"{', '.join(_owners(name))}, not {strategy!r}")
    return given
