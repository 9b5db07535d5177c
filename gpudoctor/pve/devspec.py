"""Proxmox ``devN`` values, read and checked by Proxmox's own rules. Pure.

The rules, from the sources (proxmox/pve-container ``src/PVE/LXC/Config.pm``, proxmox/
pve-common ``src/PVE/JSONSchema.pm``; our code, written to their rules):

* keys: ``$MAX_DEVICES = 256`` and the loop that declares ``dev0`` .. ``dev255`` in
  ``$confdesc``; ``check_type`` calls any other key (``dev256``, ``dev01``) an "unknown
  setting" (``parse_pct_config`` warns and keeps it);
* a value is a property string (``parse_property_string``): split on ``,``; a blank part
  is skipped; ``KEY=VALUE`` (``^([^=]+)=(.+)$``, nothing trimmed) names a key of the
  schema or is "invalid key"; a part without ``=`` is the default key (``path``); a key
  given twice, or the default key given twice (``/dev/a,/dev/b``, ``path=/dev/a,/dev/b``),
  is "duplicate key"; ``mode=`` (no value) is "missing key";
* the schema ``$dev_desc``: ``path`` (format ``pve-lxc-dev-string``,
  ``verify_lxc_dev_string``: starts with ``/dev/``, no ``/.`` or ``/..`` component),
  ``mode`` (pattern ``0[0-7]{3}``, matched whole: ``check_prop``), ``uid`` and ``gid``
  (integer ``[+-]?[0-9]+``, ``minimum => 0``), ``deny-write`` (boolean: ``1 0 on off yes
  no true false``, ``parse_boolean``); ``parse_device`` adds "Path has to be defined";
* ``check_type`` (Config.pm) refuses a value holding a line feed or carriage return.

A devN value that breaks a rule makes ``parse_device`` die, and with it the CT's start
(``update_lxc_config`` in ``src/PVE/LXC.pm`` and the pre-start hook call it for every
devN through ``foreach_passthrough_device``). Digits are ASCII only: Perl's ``\\d`` on the
config's bytes, so ``dev٠`` is no key at all (:mod:`config` classifies it INVALID).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_DEVICES = 256
SCHEMA_KEYS = ("path", "mode", "uid", "gid", "deny-write")
DEV_KEY = re.compile(r"dev([0-9]+)", re.ASCII)
_BLANK = re.compile(r"[ \t\r\n\f\v]*")
_PAIR = re.compile(r"([^=]+)=(.+)", re.DOTALL)
_MODE = re.compile(r"0[0-7]{3}")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_BOOLEAN = {"1": "1", "on": "1", "yes": "1", "true": "1",
            "0": "0", "off": "0", "no": "0", "false": "0"}  # fmt: skip
# what neither a devN value (``,`` ``=``) nor an lxc.mount.entry field (whitespace) can carry
_UNWRITABLE = re.compile(r"[,=\s\x00-\x1f\x7f]")


@dataclass(frozen=True)
class DevValue:
    """A devN value as Proxmox reads it.

    Attributes:
        path: the ``path`` (default key or ``path=``), or None when there is none.
        options: the other keys in order (``(("gid", "44"), ("mode", "0666"))``).
        problems: why Proxmox rejects the value (empty: it accepts it), in its words.
    """

    path: str | None
    options: tuple[tuple[str, str], ...] = ()
    problems: tuple[str, ...] = ()

    def get(self, key: str) -> str | None:
        """Return the value of option ``key`` (``gid``), or None."""
        return next((v for k, v in self.options if k == key), None)


def dev_index(key: str) -> int | None:
    """Return N of a ``devN`` key (ASCII digits only), or None for other keys."""
    match = DEV_KEY.fullmatch(key)
    return int(match.group(1)) if match else None


def key_problem(key: str) -> str | None:
    """Return why Proxmox does not know devN key ``key`` (``dev256``, ``dev01``), or None
    for ``dev0`` .. ``dev255`` (``$MAX_DEVICES``, ``check_type``'s "unknown setting")."""
    index = dev_index(key)
    if index is None or (key == f"dev{index}" and index < MAX_DEVICES):
        return None
    return (
        f"unknown setting '{key}': Proxmox knows dev0 to dev{MAX_DEVICES - 1} only "
        "(it warns at every read of the config; pct set refuses it)"
    )


def path_problem(path: str) -> str | None:
    """Return why ``verify_lxc_dev_string`` rejects ``path``, or None (must start with
    ``/dev/``; no ``/.`` or ``/..`` component)."""
    if re.search(r"/\.\.?(?:/|$)", path) or not path.startswith("/dev/"):
        where = "outside /dev" if not path.startswith("/dev/") else "with a . or .. component"
        return f"{path} is not a valid device path ({where})"
    return None


def parse_dev_value(value: str) -> DevValue:
    """Return the devN value parsed as ``parse_property_string($dev_desc, ...)`` and
    ``parse_device`` read it; every rule it breaks is in ``problems``."""
    path: str | None = None
    options: list[tuple[str, str]] = []
    problems: list[str] = []
    if "\n" in value or "\r" in value:
        problems.append("property contains a line feed")
    seen: set[str] = set()
    for part in value.split(","):
        if _BLANK.fullmatch(part):
            continue
        pair = _PAIR.fullmatch(part)
        if pair:
            key, item = pair.groups()
            if key in seen:
                problems.append(f"duplicate key in comma-separated list property: {key}")
                continue
            if key not in SCHEMA_KEYS:
                problems.append(f"invalid key in comma-separated list property: {key}")
                continue
            seen.add(key)
            if key == "path":
                path = item
            else:
                options.append((key, item))
        elif "=" not in part:
            if "path" in seen:
                problems.append("duplicate key in comma-separated list property: path")
                continue
            seen.add("path")
            path = part
        else:
            problems.append(f"missing key in comma-separated list property ({part!r})")
    problems.extend(_schema_problems(path, options))
    return DevValue(path, tuple(options), tuple(problems))


def _schema_problems(path: str | None, options: list[tuple[str, str]]) -> list[str]:
    """The ``check_object`` errors of ``$dev_desc`` for the parsed keys."""
    problems = []
    if path is None:
        problems.append("Path has to be defined")
    else:
        why = path_problem(path)
        if why:
            problems.append(f"path: {why}")
    for key, item in options:
        if key == "mode" and not _MODE.fullmatch(item):
            problems.append(f"mode: {item!r} does not match 0[0-7]{{3}} (write 0666, not 666)")
        elif key in ("uid", "gid") and not _INTEGER.fullmatch(item):
            problems.append(f"{key}: type check ('integer') failed - got {item!r}")
        elif key in ("uid", "gid") and int(item) < 0:
            problems.append(f"{key}: {item} is below the minimum value of 0")
        elif key == "deny-write" and item.lower() not in _BOOLEAN:
            problems.append(f"deny-write: type check ('boolean') failed - got {item!r}")
    return problems


def unwritable(path: str) -> str | None:
    """Return why ``path`` cannot be written into a devN value or an ``lxc.mount.entry``
    (a ``,`` or ``=`` splits the property string, whitespace splits the fstab fields,
    control characters break the line), or None."""
    bad = _UNWRITABLE.search(path)
    if bad is None:
        return None
    char = bad.group(0)
    name = {",": "a ','", "=": "a '='"}.get(char) or (
        "whitespace" if char.isspace() else "a control character"
    )
    return f"{path!r} holds {name}: neither a devN entry nor an lxc.mount.entry can carry it"


def mode_text(mode: int) -> str:
    """Return the ``mode=`` Proxmox accepts for a node's mode: the permission bits only
    (``0o2666`` with setgid -> ``0666``; ``0[0-7]{3}``)."""
    return f"0{mode & 0o777:03o}"


def is_true(value: str | None) -> bool:
    """Return True for a ``deny-write`` Proxmox reads as true (``1``, ``on``, ``yes``, ``true``)."""
    return value is not None and _BOOLEAN.get(value.lower()) == "1"
