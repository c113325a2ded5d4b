"""The decode loop, owned by the library: strategies plug in per-row policies."""

from formtax.decoding.loop import Plan, Policy, RowOutput, RowRequest, Step, decode, masked_mass

__all__ = ["Plan", "Policy", "RowOutput", "RowRequest", "Step", "decode", "masked_mass"]
