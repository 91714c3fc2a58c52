"""Checks of plain arguments shared by ``generate``, its methods and ``audit_generate``: now in
:mod:`hsd_torch.engine.validation` (one module for the boundary's checks), re-exported here."""

from __future__ import annotations

from .validation import as_int, is_int, is_real

__all__ = ["as_int", "is_int", "is_real"]
