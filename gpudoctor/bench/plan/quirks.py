"""Known-bad configurations: the shipped table plus a local one the launcher extends.

A quirk matches a server configuration on a GPU architecture (``sm_120`` from NVML's
compute capability, ``cpu`` without GPUs), an engine and version glob, and a set of
argument values. The launcher skips matching cells with the quirk's reason, and when a
server crashes it appends a quirk for exactly that configuration (its key) to the local
table, so the next run (any run directory) skips it until ``--retry-crashed``.
"""

from __future__ import annotations

import fnmatch
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from gpudoctor import fsio
from gpudoctor.bench.plan import ServerConfig

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

SHIPPED = Path(__file__).with_name("quirks.toml")
MatchValue = str | int | float | bool | tuple


class QuirksError(ValueError):
    """A quirks table cannot be read (one line naming the file)."""


@dataclass(frozen=True)
class Quirk:
    """One known-bad configuration.

    Attributes:
        id: a short identifier.
        arch: GPU architecture (``sm_120``, ``cpu``) or ``*``.
        engine: engine name or ``*``.
        engine_version: a glob on the engine version.
        match: ``(key, value)`` pairs that must all hold; a tuple value = any of them.
        reason: what goes wrong.
        source: ``shipped`` or the local table's path.
    """

    id: str
    arch: str
    engine: str
    engine_version: str
    match: tuple[tuple[str, MatchValue], ...]
    reason: str
    source: str = "shipped"

    def matches(self, arch: str, engine: str, version: str | None, config: ServerConfig) -> bool:
        """Return True when this quirk applies to ``config`` on ``arch`` with ``engine``."""
        if self.arch != "*" and self.arch != arch:
            return False
        if self.engine != "*" and self.engine != engine:
            return False
        if not fnmatch.fnmatchcase(version or "", self.engine_version):
            return False
        for key, wanted in self.match:
            if key == "tp":
                actual: object = config.tp
            elif key == "config_key":
                actual = config.key
            else:
                actual = config.arg(key)
            options = wanted if isinstance(wanted, tuple) else (wanted,)
            if actual is None or str(actual) not in {str(o) for o in options}:
                return False
        return True


def default_local_path() -> Path:
    """Return the local quirks table: ``$GPUDOCTOR_BENCH_QUIRKS``, else under XDG config."""
    if os.environ.get("GPUDOCTOR_BENCH_QUIRKS"):
        return Path(os.environ["GPUDOCTOR_BENCH_QUIRKS"])
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpudoctor" / "bench-quirks.toml"


def load_table(path: Path, source: str) -> list[Quirk]:
    """Return the quirks of one TOML table (empty when the file does not exist)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise QuirksError(f"{path}: cannot read quirks table: {exc}") from exc
    quirks = []
    for i, q in enumerate(data.get("quirk", [])):
        try:
            match = tuple(
                (k, tuple(v) if isinstance(v, list) else v) for k, v in q.get("match", {}).items()
            )
            quirks.append(
                Quirk(str(q["id"]), str(q.get("arch", "*")), str(q.get("engine", "*")),
                      str(q.get("engine_version", "*")), match, str(q["reason"]), source)
            )  # fmt: skip
        except (KeyError, TypeError, AttributeError) as exc:
            raise QuirksError(f"{path}: quirk[{i}] lacks {exc} (needs id and reason)") from exc
    return quirks


def load_quirks(local: Path | None = None) -> list[Quirk]:
    """Return the shipped quirks followed by the local table's."""
    local = local or default_local_path()
    return load_table(SHIPPED, "shipped") + load_table(local, str(local))


def find_quirk(
    quirks: list[Quirk], arch: str, engine: str, version: str | None, config: ServerConfig
) -> Quirk | None:
    """Return the first quirk that matches ``config``, or None."""
    return next((q for q in quirks if q.matches(arch, engine, version, config)), None)


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f",
                 "\r": "\\r"}  # fmt: skip


def toml_string(text: str) -> str:
    """Return ``text`` as a TOML basic string (``"..."``): quote, backslash and control
    characters (U+0000-U+001F, U+007F) escaped, every other character written as itself
    (UTF-8; an emoji stays one character, never JSON's surrogate pair ``\\ud83d\\ude80``,
    which TOML forbids); a lone surrogate (not encodable) becomes U+FFFD."""
    out = []
    for char in text:
        code = ord(char)
        if char in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[char])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append("\ufffd")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _toml_value(value: object) -> str:
    """Return ``value`` as a TOML value (bool, integer, float incl. inf/nan, string, array)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else ("nan" if value != value else
                                                          ("inf" if value > 0 else "-inf"))  # fmt: skip
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return toml_string(str(value))


def _shown_arg(key: str, value: object) -> object:
    """Return an argument's value as the table shows it: ``"<redacted>"`` for a
    secret-named key (``api-key``, ``hf-token``), secrets in a text replaced (the table is
    read by people and pasted into issues; the quirk matches by ``config_key`` only)."""
    from gpudoctor.redact import SECRET_NAME, Redactor

    if SECRET_NAME.search(key):
        return "<redacted>"
    return Redactor(identities=False).redact(value, "quirks") if isinstance(value, str) else value


def record_crash(
    path: Path, arch: str, engine: str, version: str | None, config: ServerConfig, reason: str
) -> Quirk:
    """Append a quirk for exactly ``config`` (its key) to the local table; return it.

    The entry also lists the configuration's label and arguments for the human reader.
    Appends under an exclusive lock and fsyncs (``cat >> TABLE``)."""
    quirk = Quirk(
        id=f"crash-{config.key}",
        arch=arch,
        engine=engine,
        engine_version=version or "*",
        match=(("config_key", config.key),),
        reason=reason,
        source=str(path),
    )
    args = ", ".join(f"{toml_string(k)} = {_toml_value(_shown_arg(k, v))}" for k, v in config.args)
    shown = "".join(c if c.isprintable() else "?" for c in config.label)  # a comment: one line
    block = (
        f"\n# added {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}: {shown}"
        f" crashed its server\n[[quirk]]\nid = {_toml_value(quirk.id)}\narch = {_toml_value(arch)}\n"
        f"engine = {_toml_value(engine)}\nengine_version = {_toml_value(quirk.engine_version)}\n"
        f"match = {{ config_key = {_toml_value(config.key)} }}\n"
        f"config = {_toml_value(config.label)}\nargs = {{ {args} }}\nreason = {_toml_value(reason)}\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # never through a link, in a directory only the caller (or root) controls
        fsio.durable_append(path, block, lock=True, follow_dir_link=True, require_trusted_dir=True)
    except fsio.FsioError as exc:
        raise QuirksError(f"cannot add to the local quirks table: {exc}") from None
    return quirk


def detect_arch() -> str:
    """Return the GPU architecture of GPU 0 as ``sm_XY`` (compute capability X.Y via NVML),
    or ``cpu`` when there is no NVIDIA driver/GPU (``nvidia-smi --query-gpu=compute_cap``)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            if pynvml.nvmlDeviceGetCount() < 1:
                return "cpu"
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(
                pynvml.nvmlDeviceGetHandleByIndex(0)
            )
            return f"sm_{major}{minor}"
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return "cpu"
