"""The engine options of `specdec.load` / `LLM`: keyword arguments → one `EngineConfig` (vLLM's `EngineArgs` shape).

    specdec.load(path, draft, max_batch_size=64, kv_cache_memory="4GiB", block_size=32, enable_prefix_caching=False)

Every field of `specdec.engine.EngineConfig` is an engine option, by its own name and with its own check; nothing
between the entry point and the engine names one, so a new option is a field of `EngineConfig` (and, for the command
line, a row of `cli/engine_flags.ENGINE_FLAGS`). An unknown name is refused naming it. What the entry points add:
their own defaults (`ENTRY_DEFAULTS`), sizes written for people (`kv_cache_memory="4GiB"`, `parse_memory`), the
largest γ sized from the default γ, and which options the eager loop honours (`LOOP_OPTIONS`: the others are refused
on it by name, never dropped).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields
from types import MappingProxyType

__all__ = ["ENTRY_DEFAULTS", "LOOP_OPTIONS", "OWN_ARGUMENTS", "engine_option_names", "check_engine_options",
           "engine_config", "parse_memory", "loop_refusal"]

#: the entry points' defaults where they differ from `EngineConfig`'s: a server of 32 rows
ENTRY_DEFAULTS = MappingProxyType({"max_batch_size": 32})
#: what the eager loop (`text.runner.FallbackRunner`) honours of the engine options
LOOP_OPTIONS = ("max_batch_size", "max_seq_len")
#: `EngineConfig` fields that `load` / `LLM` take as named arguments of their own (γ: a policy name too)
OWN_ARGUMENTS = ("num_draft_tokens",)

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)


def engine_option_names() -> tuple[str, ...]:
    """Every engine option `load` / `LLM` take as a keyword: the `EngineConfig` fields but `OWN_ARGUMENTS`."""
    from specdec.engine.config import EngineConfig

    return tuple(f.name for f in fields(EngineConfig) if f.name not in OWN_ARGUMENTS)


def parse_memory(value, name: str = "kv_cache_memory") -> int | float | None:
    """`EngineConfig.kv_cache_memory` from what a person writes: an int of bytes, a float in (0, 1] (a fraction of
    the free memory), or a string — "4GiB", "512MiB", "2G" (SI: 10⁹), "1073741824", "0.5". A bad value is a
    ValueError naming `name`."""
    if value is None or isinstance(value, bool) or not isinstance(value, str):
        return value  # (EngineConfig checks ints, floats and the rest)
    match = _SIZE.match(value)
    if match is None:
        raise ValueError(f"{name} must be bytes (e.g. 4GiB, 512MiB, 2G, 1073741824) or a fraction of free memory in "
                         f"(0, 1], got {value!r}")
    number, unit = match.group(1), (match.group(2) or "").lower()
    if not unit and "." in number and not value.strip().lower().endswith("b"):
        return float(number)  # "0.5": a fraction
    size = float(number) * _UNITS[unit]
    if size < 1 or size != int(size) and not unit:
        raise ValueError(f"{name} must be a whole number of bytes >= 1, got {value!r}")
    return int(size)


def check_engine_options(options: Mapping) -> dict:
    """The engine options as given, each name known (a TypeError naming an unknown one) and sizes parsed."""
    known = engine_option_names()
    for name in options:
        if name not in known:
            own = f"; {name} is an argument of its own" if name in OWN_ARGUMENTS else ""
            raise TypeError(f"unknown engine option {name!r}{own} (the engine options are EngineConfig's fields: "
                            f"{', '.join(known)})")
    out = dict(options)
    if "kv_cache_memory" in out:
        out["kv_cache_memory"] = parse_memory(out["kv_cache_memory"])
    return out


def engine_config(options: Mapping, num_draft_tokens=None):
    """The `EngineConfig` of checked engine options (`check_engine_options`) with the entry points' defaults; γ the
    default of a request that names none (None: the engine's), the largest γ at least 8 and at least it."""
    from specdec.engine.config import EngineConfig

    values = {**ENTRY_DEFAULTS, **options}
    if num_draft_tokens is not None:
        values["num_draft_tokens"] = num_draft_tokens
        if "max_draft_tokens" not in options:
            values["max_draft_tokens"] = max(8, num_draft_tokens if isinstance(num_draft_tokens, int) else 0)
    return EngineConfig(**values)


def loop_refusal(options: Mapping) -> str | None:
    """Why the eager loop cannot honour these engine options (the first it does not: set to other than the engine's
    default, and not a plain False, which the loop honours by having no such feature), or None."""
    from specdec.engine.config import EngineConfig

    defaults = {f.name: f.default for f in fields(EngineConfig)}
    for name, value in options.items():
        if name not in LOOP_OPTIONS and value is not defaults.get(name) and value != defaults.get(name) \
                and value is not False:
            return (f"{name}={value!r} is an option of the request-level engine (runner='engine'); this model runs on "
                    "the eager loop (runner='fallback'), which honours only " + ", ".join(LOOP_OPTIONS))
    return None
