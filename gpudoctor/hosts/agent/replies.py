"""Check what an agent answered before anything of it is used.

An agent runs on a remote host or inside a container, which may be compromised: its
replies are untrusted input. Every result is checked against the exact shape the
client expects (:func:`record` for the dataclass results, :func:`typed` for plain
values); anything else is a :class:`~gpudoctor.hosts.base.HostError` that names the
agent, the operation and what was wrong, never a ``TypeError`` from deep inside.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from gpudoctor.hosts.base import HostError

T = TypeVar("T")

# The annotations of the result dataclasses (strings under ``from __future__ import
# annotations``) and the JSON types each accepts. bool is an int in Python: refused
# where a number is expected, and only True/False where a bool is.
_ACCEPTS: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "tuple[str, ...]": (list, tuple),
}


class BadReply(HostError):
    """An agent's reply does not have the shape the protocol promises."""


def _kind_ok(value: Any, annotation: str) -> bool:
    accepted = _ACCEPTS.get(annotation)
    if accepted is None:
        return False
    if annotation != "bool" and isinstance(value, bool):
        return False
    if not isinstance(value, accepted):
        return False
    if annotation == "tuple[str, ...]":
        return all(isinstance(item, str) for item in value)
    return True


def record(cls: type[T], value: Any, where: str) -> T:
    """Return ``cls(**value)`` when ``value`` is a dict with exactly ``cls``'s fields, each
    of its declared type; raise :class:`BadReply` naming ``where`` (``"ct200: stat"``)
    and the unknown, missing or mistyped keys otherwise."""
    if not isinstance(value, dict):
        raise BadReply(f"{where}: bad reply from the agent: expected an object, got "
                       f"{type(value).__name__}")  # fmt: skip
    fields = {f.name: str(f.type) for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(str(k)[:40] for k in value if k not in fields)
    missing = sorted(k for k in fields if k not in value)
    if unknown or missing:
        parts = ([f"unknown key(s) {', '.join(unknown[:5])}"] if unknown else []) + (
            [f"missing key(s) {', '.join(missing)}"] if missing else []
        )
        raise BadReply(f"{where}: bad reply from the agent: {'; '.join(parts)}")
    wrong = [k for k, annotation in fields.items() if not _kind_ok(value[k], annotation)]
    if wrong:
        raise BadReply(
            f"{where}: bad reply from the agent: wrong type for "
            + ", ".join(f"{k} (want {fields[k]}, got {type(value[k]).__name__})" for k in wrong)
        )
    args = dict(value)
    for key, annotation in fields.items():
        if annotation == "tuple[str, ...]":
            args[key] = tuple(args[key])
        elif annotation == "float":
            args[key] = float(args[key])
    return cls(**args)


def typed(value: Any, kind: type, where: str, items: type | None = None) -> Any:
    """Return ``value`` when it is a ``kind`` (and, for a list, every item an ``items``);
    raise :class:`BadReply` naming ``where`` otherwise."""
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if ok and items is not None:
        ok = all(isinstance(item, items) for item in value)
    if not ok:
        want = kind.__name__ + (f" of {items.__name__}" if items is not None else "")
        raise BadReply(
            f"{where}: bad reply from the agent: expected {want}, got {type(value).__name__}"
        )
    return value
