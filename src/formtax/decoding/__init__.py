"""Decoding, owned by the library: the engine protocol and everything that steps a policy.

- ``engine``: what a model engine gives the loop (``Backend``, ``Batch``, ``TokenizerInfo``, ``Capability``).
- ``plan``: the vocabulary (``Plan``, ``Policy``, ``Step``, ``RowRequest``, ``RowOutput``, ``Finish``, ``Phase``).
- ``step``: the step kernel, each decision a driver makes for a row at a step, written once (choices, edits for
  an engine that samples, a row's end), and ``RowCursor``, one row's bookkeeping shared by every driver.
- ``policies``: free text, constrained, JSON caps, InWriting, a forced prefix; each says how it lowers.
- ``loop``: the one batched decode loop (:func:`decode`).
- ``lowering``, ``rowengine``: engines that own their loop (``RowEngine``): how a row is lowered onto one, and the
  replay check.
- ``sampling``: temperature, top-k, top-p, min-p.
"""

from formtax.decoding.loop import decode
from formtax.decoding.plan import Plan, Policy, RowOutput, RowRequest, Step
from formtax.decoding.step import masked_mass

__all__ = ["Plan", "Policy", "RowOutput", "RowRequest", "Step", "decode", "masked_mass"]
