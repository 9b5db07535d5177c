"""SSH targets: ``[user@]host[:port]`` plus the OpenSSH client configuration, resolved by
OpenSSH itself (``ssh -G HOST`` prints the effective options with ``Match``, ``Include``,
``Host *`` and the built-in defaults applied), so gpudoctor reads exactly what ``ssh``
reads. Without an ``ssh`` binary, paramiko's parser stands in (no ``Include``)."""

from __future__ import annotations

import getpass
import os
import pwd
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from gpudoctor.hosts.base import HostError

DEFAULT_SSH_CONFIG = "~/.ssh/config"
# Names another client config file, as ``ssh -F FILE`` does (for every gpudoctor command).
CONFIG_ENV = "GPUDOCTOR_SSH_CONFIG"
# OpenSSH's defaults, used only when no ``ssh`` binary can print them (``ssh -G``).
DEFAULT_IDENTITIES = ("id_rsa", "id_ecdsa", "id_ecdsa_sk", "id_ed25519", "id_ed25519_sk")
DEFAULT_GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")
STRICT_VALUES = {"true": "yes", "yes": "yes", "false": "no", "no": "no", "off": "no"}


@dataclass(frozen=True)
class SSHTarget:
    """Where and how to connect: ``user@host:port`` plus the effective ssh_config options.

    Attributes:
        alias: the host as the user wrote it (``pve1``).
        hostname: the address connected to (``HostName``, else alias).
        port: TCP port.
        user: login user (``User``; OpenSSH's default is the local user name).
        identity_files: private key files to try (``IdentityFile``), expanded, in order.
        identities_only: ``IdentitiesOnly``: offer only the configured keys, even from
            the agent.
        certificate_files: user certificates (``CertificateFile``), expanded.
        identity_agent: the agent socket (``IdentityAgent``; None: ``$SSH_AUTH_SOCK``;
            ``"none"``: no agent).
        user_known_hosts: ``UserKnownHostsFile`` (several allowed; keys are saved to the
            first).
        global_known_hosts: ``GlobalKnownHostsFile``.
        host_key_alias: ``HostKeyAlias``: the name the host key is stored under.
        strict_host_key_checking: ``yes``, ``accept-new``, ``no`` or ``ask`` (gpudoctor
            never prompts: ``ask`` acts as ``yes``, as in ``ssh -o BatchMode=yes``).
        proxy_jump: ``ProxyJump`` hops, first to last (``[user@]host[:port]`` each).
        proxy_command: ``ProxyCommand``, tokens expanded, or None.
        connect_timeout: ``ConnectTimeout`` in seconds, or None when unset.
        hash_known_hosts: ``HashKnownHosts``: save accepted keys under a hashed name.
        revoked_host_keys: ``RevokedHostKeys`` files (KRLs or key lists), expanded.
    """

    alias: str
    hostname: str
    port: int = 22
    user: str = "root"
    identity_files: tuple[str, ...] = field(default_factory=tuple)
    identities_only: bool = False
    certificate_files: tuple[str, ...] = field(default_factory=tuple)
    identity_agent: str | None = None
    user_known_hosts: tuple[str, ...] = field(default_factory=tuple)
    global_known_hosts: tuple[str, ...] = field(default_factory=tuple)
    host_key_alias: str | None = None
    strict_host_key_checking: str = "ask"
    proxy_jump: tuple[str, ...] = field(default_factory=tuple)
    proxy_command: str | None = None
    connect_timeout: float | None = None
    hash_known_hosts: bool = False
    revoked_host_keys: tuple[str, ...] = field(default_factory=tuple)

    @property
    def known_hosts_name(self) -> str:
        """Return the name known_hosts stores this host under: ``HostKeyAlias``, else
        ``host`` (port 22) or ``[host]:port``, as OpenSSH does."""
        if self.host_key_alias:
            return self.host_key_alias
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    @property
    def where(self) -> str:
        """Return ``user@host:port`` for messages (the alias too when it differs)."""
        text = f"{self.user}@{self.hostname}:{self.port}"
        return text if self.alias in (self.hostname, "") else f"{self.alias} ({text})"


def split_spec(spec: str) -> tuple[str | None, str, int | None]:
    """Return ``(user, host, port)`` from ``[user@]host[:port]`` (IPv6 as ``[::1]:22``)."""
    user, _, rest = spec.rpartition("@")
    port: int | None = None
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        if tail.startswith(":"):
            port = _parse_port(tail[1:], spec)
    elif rest.count(":") == 1:
        host, _, port_text = rest.partition(":")
        port = _parse_port(port_text, spec)
    else:
        host = rest
    if not host or host.startswith("-"):
        raise HostError(f"bad host {spec!r}: expected [user@]host[:port]")
    return (user or None), host, port


# What OpenSSH refuses in a host or user name given on the command line (readconf.c
# ssh_valid_hostname / ssh_valid_ruser, the CVE-2023-51385 fix): such a name reaches
# ``%h``/``%r`` in ProxyCommand and ``Match exec``, which a shell runs unquoted.
_HOST_FORBIDDEN = set("'`\"$\\;&<>|(){},")
_USER_FORBIDDEN = set("'`\";&<>|(){}")


def valid_hostname(name: str) -> bool:
    """Return True when ``name`` may be a host name as ``ssh`` accepts one: no leading
    ``-``, no shell metacharacter (``'`"$\\;&<>|(){},``), no whitespace or control
    character (``ssh -G NAME`` says "hostname contains invalid characters" otherwise)."""
    return not name.startswith("-") and not any(
        c in _HOST_FORBIDDEN or c.isspace() or _control(c) for c in name
    )


def valid_user(name: str) -> bool:
    """Return True when ``name`` may be a remote user name as ``ssh -l`` accepts one: no
    leading ``-``, no control character or ``'`";&<>|(){}``, no ``-`` after whitespace,
    no trailing backslash ("remote username contains invalid characters" otherwise)."""
    if name.startswith("-") or name.endswith("\\"):
        return False
    for index, c in enumerate(name):
        if _control(c) or c in _USER_FORBIDDEN:
            return False
        if c.isspace() and name[index + 1 : index + 2] == "-":
            return False
    return True


def _control(c: str) -> bool:
    return ord(c) < 0x20 or ord(c) == 0x7F


def check_names(host: str, user: str | None) -> None:
    """Raise HostError when ``host`` or ``user`` (from the command line, an inventory or
    a ProxyJump spec) is one ``ssh`` refuses (:func:`valid_hostname`,
    :func:`valid_user`); returns nothing. Checked before any shell sees the names."""
    if not valid_hostname(host):
        raise HostError(
            f"bad host {host!r}: the host name contains characters ssh refuses (a leading "
            "'-', whitespace, control characters or one of '`\"$\\;&<>|(){},)"
        )
    if user is not None and not valid_user(user):
        raise HostError(
            f"bad user {user!r}: the user name contains characters ssh refuses (a leading "
            "'-', control characters or one of '`\";&<>|(){})"
        )


def _parse_port(text: str, spec: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise HostError(f"bad port in {spec!r}: expected [user@]host[:port]")
    return int(text)


def resolve_target(
    spec: str,
    user: str | None = None,
    port: int | None = None,
    ssh_config: str | None = DEFAULT_SSH_CONFIG,
) -> SSHTarget:
    """Return the :class:`SSHTarget` for ``spec`` with every option ``ssh`` would use
    (``ssh -G [-F ssh_config] [-l user] [-p port] HOST``); what the user typed (``user@``,
    ``:port``, ``user``, ``port``) wins over the config file. ``ssh_config=None``: no
    config file, OpenSSH's defaults only (``-F none``)."""
    spec_user, alias, spec_port = split_spec(spec)
    login = user or spec_user
    check_names(alias, login)
    options = effective_options(alias, login, port or spec_port, ssh_config)
    return target_from_options(alias, options)


def effective_options(
    alias: str, user: str | None, port: int | None, ssh_config: str | None
) -> dict[str, list[str]]:
    """Return OpenSSH's effective client options for ``alias`` (``ssh -G``), keys in lower
    case, every value as a list (``identityfile`` may repeat)."""
    config_args, rewrite_home = _config_args(ssh_config)
    ssh = shutil.which("ssh")
    if ssh is None:
        return _paramiko_options(alias, user, port, config_args)
    argv = [ssh, "-G", *config_args]
    argv += ["-l", user] if user else []
    argv += ["-p", str(port)] if port else []
    try:
        done = subprocess.run(
            [*argv, "--", alias],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise HostError(
            f"{alias}: cannot run ssh -G to read the SSH configuration: {exc}"
        ) from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if "Pseudo-terminal" not in line]
        reason = lines[0] if lines else f"exit status {done.returncode}"
        raise HostError(
            f"{alias}: the SSH client configuration is not valid: {reason}; "
            f"fix it (`ssh -G {alias}` shows the same error)"
        )
    options: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        if rewrite_home and key in ("userknownhostsfile", "globalknownhostsfile"):
            value = " ".join(rewrite_home(path) for path in value.split())
        options.setdefault(key.lower(), []).append(value)
    return options


def _config_args(ssh_config: str | None) -> tuple[list[str], object]:
    """Return the ``-F`` arguments for ``ssh -G`` and a path rewriter (or None).

    OpenSSH finds ``~`` in the password database, Python in ``$HOME``. When they agree
    (the normal case), the default config is read exactly as ``ssh`` reads it (user config
    and /etc/ssh/ssh_config). When ``$HOME`` points elsewhere (tests, ``sudo -E``), the
    user config of ``$HOME`` is read with ``-F`` and ``~/.ssh`` paths point into
    ``$HOME``: gpudoctor honours ``$HOME`` as every Python tool does."""
    if ssh_config == DEFAULT_SSH_CONFIG and os.environ.get(CONFIG_ENV):
        ssh_config = os.environ[CONFIG_ENV]
    if ssh_config is None or ssh_config == "none":
        return ["-F", "none"], None
    home = os.path.expanduser("~")
    pw_home = _passwd_home()
    if ssh_config == DEFAULT_SSH_CONFIG and os.path.realpath(home) == os.path.realpath(pw_home):
        return [], None
    path = Path(ssh_config).expanduser()
    args = ["-F", str(path) if path.is_file() else "none"]
    if home == pw_home:
        return args, None

    def rewrite(value: str) -> str:
        prefix = pw_home.rstrip("/") + "/.ssh/"
        return (
            home.rstrip("/") + "/.ssh/" + value[len(prefix) :]
            if value.startswith(prefix)
            else value
        )

    return args, rewrite


def _passwd_home() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        return os.path.expanduser("~")


def _paramiko_options(
    alias: str, user: str | None, port: int | None, config_args: list[str]
) -> dict[str, list[str]]:
    """Return the options from paramiko's ssh_config parser (when no ``ssh`` exists), as
    ``ssh -G`` prints them: ``HostName`` expanded, every other value raw, so that
    :func:`target_from_options` expands ``%`` tokens once, with the login user that was
    asked for (paramiko's own expansion would use the config's ``User`` for ``%r``)."""
    options: dict[str, list[str]] = {}
    path = config_args[1] if config_args else os.path.expanduser(DEFAULT_SSH_CONFIG)
    if path != "none" and os.path.isfile(path):
        for key, value in _raw_config_class().from_path(path).lookup(alias).items():
            options[key] = list(value) if isinstance(value, list) else [str(value)]
    if user:  # HostName, User and Port left unset take their defaults in target_from_options
        options["user"] = [user]
    if port:
        options["port"] = [str(port)]
    options.setdefault("identityfile", [f"~/.ssh/{name}" for name in DEFAULT_IDENTITIES])
    options.setdefault("userknownhostsfile", ["~/.ssh/known_hosts ~/.ssh/known_hosts2"])
    options.setdefault("globalknownhostsfile", [" ".join(DEFAULT_GLOBAL_KNOWN_HOSTS)])
    return options


def _raw_config_class() -> type:
    """Return a paramiko SSHConfig subclass that leaves values unexpanded (see
    :func:`_paramiko_options`)."""
    import paramiko

    class RawConfig(paramiko.SSHConfig):  # type: ignore[misc]
        """paramiko's parser without its token expansion, except where ``ssh -G`` prints
        values expanded too (``HostName``; ``Match exec`` runs during the lookup)."""

        def _tokenize(self, config, target_hostname, key, value):  # type: ignore[no-untyped-def]
            if key in ("hostname", "match-exec"):
                return super()._tokenize(config, target_hostname, key, value)
            return value

    return RawConfig


def target_from_options(alias: str, options: dict[str, list[str]]) -> SSHTarget:
    """Return the :class:`SSHTarget` that ``ssh -G`` output ``options`` describes
    (``~`` and ``%`` tokens expanded as OpenSSH does)."""

    def one(key: str) -> str | None:
        """Return the option's first value (None when it is unset)."""
        values = options.get(key)
        return values[0] if values else None

    def yes(key: str) -> bool:
        return (one(key) or "").lower() in ("yes", "true")

    hostname = one("hostname") or alias
    port = int(one("port") or 22)
    user = one("user") or getpass.getuser()
    partial = SSHTarget(alias=alias, hostname=hostname, port=port, user=user)
    host_key_alias = one("hostkeyalias")
    tokens = _tokens(partial, host_key_alias)

    def paths(key: str) -> tuple[str, ...]:
        found: list[str] = []
        for value in options.get(key, []):
            several = key.endswith("knownhostsfile") or key == "revokedhostkeys"
            for item in value.split() if several else [value]:
                path = expand(item, tokens)
                if path not in found and path.lower() != "none":
                    found.append(path)
        return tuple(found)

    timeout = one("connecttimeout")
    jump = one("proxyjump")
    command = one("proxycommand")
    agent = one("identityagent")
    strict = (one("stricthostkeychecking") or "ask").lower()
    return SSHTarget(
        alias=alias,
        hostname=hostname,
        port=port,
        user=user,
        identity_files=paths("identityfile"),
        identities_only=yes("identitiesonly"),
        certificate_files=paths("certificatefile"),
        identity_agent=(
            None
            if agent is None or agent == "SSH_AUTH_SOCK"
            else ("none" if agent.lower() == "none" else expand(agent, tokens))
        ),
        user_known_hosts=paths("userknownhostsfile"),
        global_known_hosts=paths("globalknownhostsfile"),
        host_key_alias=host_key_alias,
        strict_host_key_checking=STRICT_VALUES.get(strict, strict),
        proxy_jump=tuple(j for j in (jump or "").split(",") if j and j.lower() != "none"),
        proxy_command=(
            expand(command, tokens, home=False) if command and command.lower() != "none" else None
        ),
        connect_timeout=float(timeout) if timeout and timeout != "none" else None,
        hash_known_hosts=yes("hashknownhosts"),
        revoked_host_keys=paths("revokedhostkeys"),
    )


def _tokens(target: SSHTarget, host_key_alias: str | None) -> dict[str, str]:
    local = socket.gethostname()
    return {
        "%": "%",
        "h": target.hostname,
        "p": str(target.port),
        "r": target.user,
        "n": target.alias,
        "k": host_key_alias or target.hostname,
        "u": getpass.getuser(),
        "d": os.path.expanduser("~"),
        "i": str(os.getuid()),
        "l": local,
        "L": local.split(".")[0],
    }


def expand(text: str, tokens: dict[str, str], home: bool = True) -> str:
    """Return ``text`` with OpenSSH's ``%`` tokens (``%h %p %r %n %k %u %d %i %l %L %%``)
    and, for paths, a leading ``~`` expanded; an unknown token raises HostError."""
    out: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char == "%" and index + 1 < len(text):
            code = text[index + 1]
            if code not in tokens:
                raise HostError(f"unknown token %{code} in the SSH configuration value {text!r}")
            out.append(tokens[code])
            index += 2
            continue
        out.append(char)
        index += 1
    value = "".join(out)
    return os.path.expanduser(value) if home else value
