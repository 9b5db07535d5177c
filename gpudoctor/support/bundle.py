"""A support bundle: the gathered Items, redacted, in one ``.tar.gz``.

The archive holds one folder, ``gpudoctor-bundle/``, with the Items' files, a
``MANIFEST.json`` (each file, how it was obtained, gpudoctor's version, whether identities
were kept) and a ``REDACTED.json`` (each placeholder, its kind and the files it stands in;
never a value). Secrets are replaced in every case; host names, IPs, MAC addresses and
user names unless ``identities`` is False (``--no-redact``).
"""

from __future__ import annotations

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
from gpudoctor.support.gather import Item
from gpudoctor.support.redact import Redactor

ROOT = "gpudoctor-bundle"


@dataclass(frozen=True)
class Bundle:
    """A finished bundle: the archive's bytes, the names of its files, and the ledger of
    what was redacted (placeholders, kinds, files; no values)."""

    data: bytes
    names: tuple[str, ...]
    ledger: tuple[dict[str, object], ...]


def identities_of(hosts: Iterable[Host], environ: dict[str, str]) -> tuple[set[str], set[str]]:
    """Return (host names, user names) this bundle must hide: this machine's names and
    user, and for every remote Host its SSH target (alias, HostName, user) and the names it
    gives itself (``hostname; hostname -f``)."""
    names = {socket.gethostname(), socket.getfqdn()}
    users = {getpass.getuser(), environ.get("SUDO_USER", ""), environ.get("USER", "")}
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
    files: list[tuple[str, str]] = [(i.name, redactor.redact(i.text, i.name)) for i in items]
    manifest = {
        "schema": "gpudoctor.bundle/1",
        "gpudoctor": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamp)),
        "identities_redacted": redactor.identities,
        "files": [
            {"name": name, "source": redactor.redact(i.source, "MANIFEST.json")}
            for (name, _), i in zip(files, items, strict=True)
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
