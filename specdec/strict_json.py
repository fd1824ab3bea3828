"""Strict JSON (RFC 8259) for everything specdec writes: NaN and ±Infinity become null, never bare `NaN`.

Python's `json.dumps` writes `NaN`/`Infinity` by default, which strict parsers (JavaScript's JSON.parse,
jq, Go, Rust serde) reject. Every JSON file and `--json` line goes through `dumps`.
"""

from __future__ import annotations

import json
import math

__all__ = ["finite_or_none", "dumps"]


def finite_or_none(value):
    """Replace NaN/±inf floats by None, recursively (dicts, lists, tuples); dict keys become strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def _default(value):
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        try:
            return finite_or_none(value.item())
        except (TypeError, ValueError, RuntimeError):
            pass
    if hasattr(value, "to_dict") and callable(value.to_dict):
        return finite_or_none(value.to_dict())
    return str(value)


def dumps(obj, **kwargs) -> str:
    """`json.dumps` that always produces strict JSON; objects it cannot encode become strings."""
    return json.dumps(finite_or_none(obj), allow_nan=False, default=_default, **kwargs)
