"""Parser and writer for container configs that round-trip byte for byte.

Two flavors:

* ``pve``: Proxmox's ``/etc/pve/lxc/<vmid>.conf``. The classification of every line follows
  pve-container's ``parse_pct_config`` (``src/PVE/LXC/Config.pm``): the live config is
  every line before the first ``[section]`` header (``[snapname]``, ``[pve:pending]``);
  ``#`` lines at column 0 are the CT *description* (GUI notes), not comments; raw keys
  ``lxc.*`` accept ``k: v`` and ``k = v``; other keys are ``key: value``.
* ``lxc``: plain LXC's ``/var/lib/lxc/<name>/config``: ``key = value`` and ``#`` comments,
  no sections.

A :class:`Config` keeps every line's exact text and line ending, so ``config.text`` of an
unchanged config is the input, byte for byte. Edits (:meth:`Config.insert_after`,
:meth:`Config.remove`) return a new Config; nothing is ever mutated.
"""

from __future__ import annotations

import difflib
import enum
import re
from dataclasses import dataclass, replace

PVE = "pve"
LXC = "lxc"
FLAVORS = (PVE, LXC)

PMXCFS_MAX_BYTES = 1024 * 1024  # pmxcfs refuses files larger than 1 MiB

# Perl's \s on byte strings (pve-container's regexes): no Unicode spaces.
_WS = r"[ \t\r\f\v]"
_BLANK = re.compile(rf"{_WS}*")
# re.ASCII everywhere: pve-container's Perl regexes run on the file's BYTES, where \d is
# [0-9] and /i folds A-Z only. Python's str patterns would take an Arabic-Indic digit for
# \d (`dev٠`) and the Kelvin sign for k under IGNORECASE (`[\u212asnap]`): not keys or
# headers for Proxmox (parse_pct_config warns "unable to parse config"), so not for us.
_A = re.ASCII
_PENDING = re.compile(rf"\[(pve:pending)\]{_WS}*", re.IGNORECASE | _A)
_SNAPSHOT = re.compile(rf"\[([a-z][a-z0-9_\-]+)\]{_WS}*", re.IGNORECASE | _A)
_PVE_RAW = re.compile(rf"(lxc\.[a-z0-9_\-.]+)(:|{_WS}*=)({_WS}*)(.*?){_WS}*", _A)
_PVE_DELETE = re.compile(rf"(delete)(:)({_WS}*)(.*\S){_WS}*", _A)
_PVE_OPTION = re.compile(rf"([a-z][a-z_]*[0-9]*)(:)({_WS}*)(.+?){_WS}*", _A)
_LXC_ITEM = re.compile(rf"({_WS}*)([^=]*?)({_WS}*=)({_WS}*)(.*?){_WS}*", _A)


class ConfigError(ValueError):
    """The text cannot be handled as a container config (the message says why and where)."""


class Kind(str, enum.Enum):
    """What one config line is."""

    BLANK = "blank"
    DESCRIPTION = "description"  # '#' at column 0 (pve: CT notes; lxc: a comment)
    SECTION = "section"  # [snapname] or [pve:pending]
    RAW = "raw"  # lxc.* key (both flavors)
    OPTION = "option"  # pve key: value (arch, devN, mpN, lock, ...)
    INVALID = "invalid"  # kept verbatim; the tools that own the file would warn or refuse


@dataclass(frozen=True)
class Line:
    """One line of a config, exactly as written.

    Attributes:
        text: the line without its line ending (a trailing ``\\r`` of CRLF files stays here).
        eol: ``"\\n"``, or ``""`` for a last line that has no newline.
        kind: what the line is.
        key: the key (``lxc.cgroup2.devices.allow``, ``dev0``) or section name; else ``""``.
        value: the value with surrounding whitespace removed (what Proxmox/LXC read).
    """

    text: str
    eol: str = "\n"
    kind: Kind = Kind.INVALID
    key: str = ""
    value: str = ""

    @property
    def raw(self) -> str:
        """Return the line's exact bytes as text (``text + eol``)."""
        return self.text + self.eol


@dataclass(frozen=True)
class Section:
    """A ``[name]`` section: its name and the line indexes it spans (header included)."""

    name: str
    start: int
    end: int


@dataclass(frozen=True)
class Config:
    """A parsed config: its lines in order and its flavor (``pve`` or ``lxc``)."""

    lines: tuple[Line, ...]
    flavor: str = PVE

    @property
    def text(self) -> str:
        """Return the config as text, byte-identical to the input when nothing was edited."""
        return "".join(line.raw for line in self.lines)

    @property
    def main_end(self) -> int:
        """Return the index of the first section header (``len(lines)`` when none)."""
        for index, line in enumerate(self.lines):
            if line.kind is Kind.SECTION:
                return index
        return len(self.lines)

    def main(self) -> list[tuple[int, Line]]:
        """Return ``(index, line)`` for every line of the live config (before any section)."""
        return list(enumerate(self.lines[: self.main_end]))

    def sections(self) -> list[Section]:
        """Return the ``[name]`` sections (snapshots, ``pve:pending``) in file order."""
        headers = [i for i, line in enumerate(self.lines) if line.kind is Kind.SECTION]
        bounds = [*headers, len(self.lines)]
        return [Section(self.lines[h].key, h, bounds[n + 1]) for n, h in enumerate(headers)]

    def get_all(self, key: str) -> list[tuple[int, Line]]:
        """Return ``(index, line)`` of every live-config line with this key, in order."""
        return [(i, line) for i, line in self.main() if line.key == key and is_item(line)]

    def get(self, key: str) -> str | None:
        """Return the value of the last live-config line with this key (the one in effect)."""
        found = self.get_all(key)
        return found[-1][1].value if found else None

    def pairs(self) -> list[tuple[str, str]]:
        """Return the live config's ``(key, value)`` pairs in order (for comparing meaning)."""
        return [(line.key, line.value) for _, line in self.main() if is_item(line)]

    def insert_after(self, index: int, new_lines: list[Line]) -> Config:
        """Return a new Config with ``new_lines`` inserted after line ``index`` (-1: at top).

        Inserting after a last line that has no newline gives that line a newline first.
        """
        return self.edit({index: new_lines}, set())

    def remove(self, indexes: set[int]) -> Config:
        """Return a new Config without the lines at ``indexes``."""
        return self.edit({}, indexes)

    def edit(self, inserts: dict[int, list[Line]], removes: set[int]) -> Config:
        """Return a new Config with lines inserted after original indexes (``-1``: at the
        top) and the lines at ``removes`` dropped, all indexes referring to this Config."""
        out: list[Line] = list(inserts.get(-1, []))
        for index, line in enumerate(self.lines):
            if index not in removes:
                out.append(line)
            out.extend(inserts.get(index, []))
        for pos in range(len(out) - 1):
            if out[pos].eol == "":
                out[pos] = replace(out[pos], eol="\n")
        return replace(self, lines=tuple(out))

    def make_line(self, key: str, value: str, like: Line | None = None) -> Line:
        """Return a new item line ``key: value`` (pve) or ``key = value`` (lxc).

        ``like`` is a neighbour line whose separator style (``:`` or ``=``) and CRLF ending
        the new line copies, so an edit looks like the lines around it.
        """
        sep = ": " if self.flavor == PVE else " = "
        if like is not None and like.kind is Kind.RAW and key.startswith("lxc."):
            sep = separator_of(like) or sep
        if not key.startswith("lxc.") and self.flavor == PVE:
            sep = ": "
        cr = "\r" if like is not None and like.text.endswith("\r") else ""
        return classify(f"{key}{sep}{value}{cr}", "\n", self.flavor)


def is_item(line: Line) -> bool:
    """Return True for key/value lines (raw ``lxc.*`` keys and Proxmox options)."""
    return line.kind in (Kind.RAW, Kind.OPTION)


def separator_of(line: Line) -> str:
    """Return the separator as written between key and value (``": "``, ``" = "``)."""
    rest = line.text.lstrip()[len(line.key) :]
    match = re.match(rf"({_WS}*[:=]{_WS}*)", rest)
    return match.group(1) if match else ""


def classify(text: str, eol: str, flavor: str = PVE) -> Line:
    """Return the :class:`Line` for one line of text, classified as the flavor's tool would."""
    if flavor == LXC:
        return _classify_lxc(text, eol)
    if _BLANK.fullmatch(text):
        return Line(text, eol, Kind.BLANK)
    match = _PENDING.fullmatch(text) or _SNAPSHOT.fullmatch(text)
    if match:
        return Line(text, eol, Kind.SECTION, match.group(1))
    if text.startswith("#"):
        return Line(text, eol, Kind.DESCRIPTION)
    match = _PVE_RAW.fullmatch(text)
    if match:
        return Line(text, eol, Kind.RAW, match.group(1), match.group(4))
    match = _PVE_DELETE.fullmatch(text) or _PVE_OPTION.fullmatch(text)
    if match:
        return Line(text, eol, Kind.OPTION, match.group(1), match.group(4))
    return Line(text, eol, Kind.INVALID)


def _classify_lxc(text: str, eol: str) -> Line:
    stripped = text.lstrip(" \t")
    if _BLANK.fullmatch(text):
        return Line(text, eol, Kind.BLANK)
    if stripped.startswith("#"):
        return Line(text, eol, Kind.DESCRIPTION)
    match = _LXC_ITEM.fullmatch(text)
    if match and match.group(2).startswith("lxc."):
        return Line(text, eol, Kind.RAW, match.group(2), match.group(5))
    return Line(text, eol, Kind.INVALID)


def parse(data: str | bytes, flavor: str = PVE) -> Config:
    """Return the parsed config; raise :class:`ConfigError` when it cannot be one.

    Errors: bytes that are not UTF-8, NUL characters, unpaired surrogates, a ``pve`` config
    over pmxcfs's 1 MiB limit, an unknown flavor. Lines neither tool understands are kept
    as :attr:`Kind.INVALID` (Proxmox only warns about them), never dropped.
    """
    if flavor not in FLAVORS:
        raise ConfigError(f"unknown config flavor {flavor!r} (expected one of {FLAVORS})")
    text = _decode(data)
    if "\0" in text:
        line_no = text[: text.index("\0")].count("\n") + 1
        raise ConfigError(f"line {line_no}: NUL character (this is not a text config)")
    size = len(text.encode("utf-8", "surrogatepass"))
    if flavor == PVE and size > PMXCFS_MAX_BYTES:
        raise ConfigError(f"{size} bytes: larger than pmxcfs's 1 MiB limit for /etc/pve files")
    pieces = text.split("\n")
    lines = [classify(piece, "\n", flavor) for piece in pieces[:-1]]
    if pieces[-1]:
        lines.append(classify(pieces[-1], "", flavor))
    return Config(tuple(lines), flavor)


def _decode(data: str | bytes) -> str:
    if isinstance(data, bytes):
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"byte {exc.start}: not valid UTF-8 ({exc.reason})") from None
    try:
        data.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(f"character {exc.start}: unpaired surrogate, not writable") from None
    return data


def write(config: Config) -> str:
    """Return the config's text (the inverse of :func:`parse`: ``parse(write(c)) == c``)."""
    return config.text


def split_lines(text: str) -> list[str]:
    """Return the text split after every ``\\n`` (keeping them), unlike str.splitlines."""
    pieces = text.split("\n")
    out = [p + "\n" for p in pieces[:-1]]
    if pieces[-1]:
        out.append(pieces[-1])
    return out


def unified_diff(old: str, new: str, label: str) -> str:
    """Return ``diff -u a/LABEL b/LABEL`` of the two texts ("" when equal)."""
    if old == new:
        return ""
    lines = difflib.unified_diff(
        split_lines(old),
        split_lines(new),
        f"a/{label.lstrip('/')}",
        f"b/{label.lstrip('/')}",
        lineterm="\n",
    )
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)
