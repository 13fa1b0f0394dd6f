"""Errors the training side raises for problems a user can fix."""

from __future__ import annotations


class ModelSourceError(RuntimeError):
    """A model's weights or tokenizer cannot be found or read; the message says how to fix it."""
