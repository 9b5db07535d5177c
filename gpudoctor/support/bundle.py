"""A support bundle: the gathered Items, redacted, in one ``.tar.gz``.

The archive holds one folder, ``gpudoctor-bundle/``, with the Items' files, a
``MANIFEST.json`` (each file, how it was obtained, gpudoctor's version, whether identities
were kept) and a ``REDACTED.json`` (each placeholder, its kind and the files it stands in;
never a value). Secrets are replaced in every case; host names, IPs, MAC addresses and
user names unless ``identities`` is False (``--no-redact``).
"""

from __future__ import annotations

import contextlib
import getpass
import io
import json
import os
import socket
import tarfile
import time
from collections.abc import Iterable
from dataclasses import dataclass

from gpudoctor import __version__
from gpudoctor.hosts.base import Host, HostError
from gpudoctor.redact import Redactor
from gpudoctor.support.gather import Item

ROOT = "gpudoctor-bundle"


@dataclass(frozen=True)
class Bundle:
    """A finished bundle: the archive's bytes, the names of its files, and the ledger of
    what was redacted (placeholders, kinds, files; no values)."""

    data: bytes
    names: tuple[str, ...]
    ledger: tuple[dict[str, object], ...]


def login_users(passwd: str) -> set[str]:
    """Return the people's login names of a ``/etc/passwd`` text (uid 1000 to 60000, the
    range Debian gives them) and the last part of their home directories: names that
    appear outside ``/home`` too (``/srv/alice``, ``alice@pve1``)."""
    users = set()
    for line in passwd.splitlines():
        fields = line.split(":")
        if len(fields) >= 6 and fields[2].isdigit() and 1000 <= int(fields[2]) <= 60000:
            users |= {fields[0], fields[5].rstrip("/").rsplit("/", 1)[-1]}
    return users


def identities_of(hosts: Iterable[Host], environ: dict[str, str]) -> tuple[set[str], set[str]]:
    """Return (host names, user names) this bundle must hide: this machine's names and
    users (the caller, and every person's login of ``/etc/passwd``), and for every remote
    Host its SSH target (alias, HostName, user), the names it gives itself (``hostname;
    hostname -f``) and the people's logins of its ``/etc/passwd``."""
    from gpudoctor.hosts.local import LocalHost

    names = {socket.gethostname(), socket.getfqdn()}
    users = {getpass.getuser(), environ.get("SUDO_USER", ""), environ.get("USER", "")}
    for host in [LocalHost(), *hosts]:
        with contextlib.suppress(OSError, HostError, UnicodeDecodeError):
            users |= login_users(host.read_text("/etc/passwd", limit=4 << 20))
    for host in hosts:
        target = getattr(host, "target", None)
        if target is not None:
            names |= {target.alias, target.hostname}
            users.add(target.user)
        for argv in (["hostname"], ["hostname", "-f"]):
            try:
                result = host.run(argv, timeout=10)
            except HostError:
                continue
            if result.ok:
                names.add(result.stdout.strip())
    return {n for n in names if n}, {u for u in users if u}


def redactor_for(
    identities: bool, environ: dict[str, str], hosts: set[str], users: set[str]
) -> Redactor:
    """Return a Redactor that knows this machine's secret environment values and the
    host and user names to hide (kept when ``identities`` is False)."""
    redactor = Redactor(identities=identities)
    redactor.add_secrets_from_env(environ)
    for name in sorted(hosts):
        redactor.add_host(name)
    for name in sorted(users):
        redactor.add_user(name)
    return redactor


def build(items: list[Item], redactor: Redactor, now: float | None = None) -> Bundle:
    """Return the bundle of ``items``: each text redacted, then a MANIFEST.json and a
    REDACTED.json, packed as a gzip'ed tar (files 0600, owner 0, mtime ``now``)."""
    stamp = time.time() if now is None else now
    # every file and every source line at once: a value redacted in one is replaced in all
    texts = redactor.redact_all(
        [(i.name, i.text) for i in items]
        + [("MANIFEST.json", json.dumps([i.source for i in items]))]
    )
    sources = json.loads(texts.pop())
    files: list[tuple[str, str]] = [(i.name, text) for i, text in zip(items, texts, strict=True)]
    manifest = {
        "schema": "gpudoctor.bundle/1",
        "gpudoctor": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamp)),
        "identities_redacted": redactor.identities,
        "files": [
            {"name": name, "source": source}
            for (name, _), source in zip(files, sources, strict=True)
        ],
    }
    ledger = redactor.ledger()
    redacted = {
        "note": "each value below was replaced by its placeholder in every file; the values "
        "themselves are not in this archive"
        + ("" if redactor.identities else " (--no-redact: host names, IPs and users kept)"),
        "redacted": ledger,
    }
    files.append(("MANIFEST.json", json.dumps(manifest, indent=2) + "\n"))
    files.append(("REDACTED.json", json.dumps(redacted, indent=2) + "\n"))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files:
            data = text.encode("utf-8")
            info = tarfile.TarInfo(f"{ROOT}/{name}")
            info.size, info.mode, info.mtime = len(data), 0o600, int(stamp)
            tar.addfile(info, io.BytesIO(data))
    return Bundle(buffer.getvalue(), tuple(n for n, _ in files), tuple(ledger))


def default_name(now: float | None = None) -> str:
    """Return the archive's default file name, ``gpudoctor-bundle-YYYYmmdd-HHMMSS.tar.gz``."""
    stamp = time.gmtime(time.time() if now is None else now)
    return time.strftime("gpudoctor-bundle-%Y%m%d-%H%M%S.tar.gz", stamp)


def environ_copy() -> dict[str, str]:
    """Return a copy of this process's environment (what the bundle may name)."""
    return dict(os.environ)
