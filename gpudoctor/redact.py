"""Redaction of secrets and identities (the support bundle, report.html, the quirks table).

A :class:`Redactor` replaces each sensitive value with a stable placeholder (the same
value gets the same ``<ip-1>`` in every file of the bundle, so a supporter can still see
that two lines name the same machine) and counts where it did so. It never keeps the
original value anywhere it could be written out: :meth:`Redactor.ledger` lists
placeholders, kinds and files only.

Two classes of value:

- **secrets** (tokens, keys, passwords, PEM private keys, the values of secret-named
  environment variables): always replaced, ``--no-redact`` included;
- **identities** (host names, IP and MAC addresses, user names): replaced unless the
  user keeps them (``identities=False``, what ``--no-redact`` sets).
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass, field

# an environment variable (or config key) whose value is a secret
_SECRET_WORDS = (
    r"token(?!iz)|secret|passw|passphrase|api[_-]?key|apikey|access[_-]?key|private[_-]?key"
    r"|credential|auth|cookie|session[_-]?id|_key$"  # (a tokenizer is no secret)
    r"|(?<![a-z])(?:pass|pw)(?![a-z])|_pwd(?![a-z])"  # DB_PASS, SMTP_PW, MYSQL_PWD (not PWD)
)
SECRET_NAME = re.compile(rf"(?i)({_SECRET_WORDS}|^key$)")
# a JSON field whose value is a secret (``key`` alone names a bench cell there)
_SECRET_FIELD = re.compile(rf"(?i)({_SECRET_WORDS})")

# well-known token shapes (issuer prefixes), PEM blocks, bearer headers, URL passwords
_TOKEN_SHAPES: tuple[re.Pattern[str], ...] = (
    re.compile(
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----.*?-----END [A-Z0-9 ]*PRIVATE KEY"
        r"(?: BLOCK)?-----",
        re.S,
    ),
    re.compile(r"\bhf_[A-Za-z0-9]{16,}"),  # Hugging Face
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}"),  # GitHub
    re.compile(r"\bglpat-[A-Za-z0-9_-]{16,}"),  # GitLab
    re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{16,}"),  # OpenAI, Anthropic
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),  # AWS access key id
    re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),  # Slack
    re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),  # JWT
    re.compile(r"\bPVEAPIToken=\S+"),  # Proxmox API token header
    re.compile(r"\bnvapi-[A-Za-z0-9_-]{16,}"),  # NVIDIA (build.nvidia.com, NGC)
)
# "Authorization: Bearer X", "Bearer X": the credential after the scheme
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+([A-Za-z0-9._~+/=-]{12,})")
# scheme://user:password@host: the password
_URL_PASSWORD = re.compile(r"([a-z][a-z0-9+.-]*://[^\s:/@]+:)([^\s@/]+)(@)", re.I)
# key = value, key: value, "key": "value", --key value, KEY=value where key names a secret
_ASSIGNED = re.compile(
    r"""(?ix)
    (?P<key>["']?[A-Za-z0-9_.-]*
       (?:token|secret|passw(?:or)?d?|passphrase|api[_-]?key|apikey|access[_-]?key
          |private[_-]?key|credential|auth(?:orization)?|cookie
          |(?<![a-z])(?:pass|pw)(?![a-z])|_pwd(?![a-z]))
       [A-Za-z0-9_.-]*["']?)
    (?P<sep>\s*[:=]\s*|\s+)
    (?P<value>"[^"\n]+"|'[^'\n]+'|[^\s"',;]+)
    """
)
_IPV4 = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.])")
# an IPv6 address, also after a label (``inet6 addr:2001:db8::5/64``) and with a dotted
# IPv4 tail (``::ffff:198.51.100.23``: the whole address, not its first hex group only)
_IPV6_CANDIDATE = re.compile(
    r"(?:(?<![\w:])|(?<=[A-Za-z]:))(?:[0-9A-Fa-f]{0,4}:){2,7}"
    r"(?:\d{1,3}(?:\.\d{1,3}){3}|[0-9A-Fa-f]{0,4})(?![\w:]|\.\d)"
)
_MAC = re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}(?![\w:])")
_HOME = re.compile(r"/home/([A-Za-z0-9._-]+)")
# a GPU's own identity (nvidia-smi -q, the kernel log): its UUID and board serial number
_GPU_UUID = re.compile(
    r"\b(?:GPU|MIG)-[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}\b"
)
_SERIAL = re.compile(r"(?i)(serial number\s*(?::|is)\s*)([0-9A-Za-z][0-9A-Za-z-]{3,})")
# an argument that names a secret (``--api-key``), whose value is the next argument
_SECRET_FLAG = re.compile(r"^--?[A-Za-z0-9_-]+$")
# names never worth hiding: they identify no one
GENERIC_NAMES = frozenset(
    {"root", "localhost", "localhost.localdomain", "nobody", "ubuntu", "debian", "user", "admin",
     "none", "null", "true", "false", "local", "pve", "proxmox", "lxc", "nvidia"}
)  # fmt: skip


@dataclass
class Redactor:
    """Replaces secrets (always) and identities (when ``identities``) with stable
    placeholders; remembers which placeholder each value got and where it replaced it."""

    identities: bool = True
    _values: dict[tuple[str, str], str] = field(default_factory=dict)  # (kind, value) -> ph
    _counts: dict[str, dict[str, int]] = field(default_factory=dict)  # ph -> file -> n
    _kinds: dict[str, str] = field(default_factory=dict)  # ph -> kind
    _literals: dict[str, str] = field(default_factory=dict)  # value -> kind (names, secrets)
    _learning: bool = False  # redact_all's first pass: remember every secret found

    def add_secret(self, value: str) -> None:
        """Remember a known secret value (an environment variable's, a config's) so it is
        replaced wherever it appears, even in a shape no pattern knows; returns None."""
        if len(value) >= 4 and value.lower() not in GENERIC_NAMES:
            self._literals[value] = "secret"

    def add_host(self, name: str | None) -> None:
        """Remember a host name (and its short form) to replace; returns None."""
        for each in {name or "", (name or "").split(".")[0]}:
            if len(each) >= 2 and each.lower() not in GENERIC_NAMES and not _is_ip(each):
                self._literals.setdefault(each, "host")

    def add_user(self, name: str | None) -> None:
        """Remember a user name to replace; returns None."""
        if name and len(name) >= 2 and name.lower() not in GENERIC_NAMES:
            self._literals.setdefault(name, "user")

    def add_secrets_from_env(self, environ: dict[str, str]) -> None:
        """Remember the value of every secret-named variable of ``environ`` (HF_TOKEN,
        AWS_SECRET_ACCESS_KEY, ...); returns None."""
        for name, value in environ.items():
            if SECRET_NAME.search(name):
                self.add_secret(value)

    def placeholder(self, kind: str, value: str) -> str:
        """Return the stable placeholder of ``value`` (``<kind-N>``, N counting from 1 per
        kind in the order values are first seen)."""
        key = (kind, value)
        if key not in self._values:
            n = sum(1 for k in self._values if k[0] == kind) + 1
            ph = f"<{kind}-{n}>"
            self._values[key] = ph
            self._kinds[ph] = kind
        return self._values[key]

    def redact(self, text: str, where: str) -> str:
        """Return ``text`` with every secret (and, when ``identities``, every host name,
        IP, MAC address and user name) replaced by its placeholder; ``where`` names the
        file for the ledger."""

        def sub(kind: str) -> object:
            def repl(m: re.Match[str]) -> str:
                if kind == "secret":
                    return self._secret(m.group(0), where)
                return self._note(self.placeholder(kind, m.group(0)), where)

            return repl

        for value in sorted((v for v, k in self._literals.items() if k == "secret"), key=len,
                            reverse=True):  # fmt: skip
            for _ in range(text.count(value)):
                ph = self._note(self.placeholder("secret", value), where)
                text = text.replace(value, ph, 1)
        for pattern in _TOKEN_SHAPES:
            text = pattern.sub(sub("secret"), text)  # type: ignore[arg-type]
        text = _URL_PASSWORD.sub(
            lambda m: m.group(1) + self._secret(m.group(2), where) + m.group(3), text
        )
        text = _BEARER.sub(lambda m: f"{m.group(1)} {self._secret(m.group(2), where)}", text)
        text = _ASSIGNED.sub(lambda m: self._assigned(m, where), text)
        if not self.identities:
            return text
        text = _MAC.sub(sub("mac"), text)  # type: ignore[arg-type]
        text = _GPU_UUID.sub(sub("gpu"), text)  # type: ignore[arg-type]
        text = _SERIAL.sub(lambda m: m.group(1) + self._name("serial", m.group(2), where), text)
        text = _IPV6_CANDIDATE.sub(lambda m: self._ip(m.group(0), where), text)
        text = _IPV4.sub(lambda m: self._ip(m.group(0), where), text)
        text = _HOME.sub(lambda m: "/home/" + self._name("user", m.group(1), where), text)
        for value in sorted((v for v, k in self._literals.items() if k != "secret"), key=len,
                            reverse=True):  # fmt: skip
            bounded = re.compile(rf"(?<![A-Za-z0-9_-]){re.escape(value)}(?![A-Za-z0-9_-])")
            kind = self._literals[value]
            text = bounded.sub(lambda m, k=kind: self._name(k, m.group(0), where), text)  # type: ignore[misc]
        return text

    def redact_json(self, value: object, where: str, key: str = "") -> object:
        """Return the parsed JSON ``value`` with every string redacted before it is
        serialized again (a JSON-escaped log line, ``{\\"api_key\\": \\"K\\"}``, hides
        its shape from the text patterns): the value of a secret-named key, and the word
        after a secret-named flag in a list (an argv's ``"--api-key", "K"``), is a secret;
        every other string goes through :meth:`redact`."""
        if isinstance(value, str):
            if _SECRET_FIELD.search(key) and value:
                return self._secret(value, where)
            return self.redact(value, where)
        if isinstance(value, dict):
            return {self.redact(k, where): self.redact_json(v, where, k) for k, v in value.items()}
        if isinstance(value, list):
            flag = ""
            out = []
            for each in value:
                out.append(self.redact_json(each, where, flag))
                named = isinstance(each, str) and _SECRET_FLAG.match(each)
                flag = each if named and SECRET_NAME.search(each) else ""  # type: ignore[assignment]
            return out
        return value

    def redact_all(self, texts: list[tuple[str, str]]) -> list[str]:
        """Return each (name, text) of ``texts`` redacted, every value redacted in one of
        them replaced in all of them (an API key found as ``token=K`` in one file, and
        quoted bare in another): a first pass learns the secrets, the second replaces.
        A ``.json`` file, and each line of a ``.jsonl`` file, that parses as JSON is
        redacted as parsed values (:meth:`redact_json`) and serialized again."""
        self._learning = True
        for name, text in texts:
            self._redact_file(name, text)
        self._learning = False
        self._counts.clear()
        return [self._redact_file(name, text) for name, text in texts]

    def _redact_file(self, name: str, text: str) -> str:
        if name.endswith(".jsonl"):
            return "".join(self._redact_json_text(line, name) for line in text.splitlines(True))
        if name.endswith(".json"):
            return self._redact_json_text(text, name)
        return self.redact(text, name)

    def _redact_json_text(self, text: str, where: str) -> str:
        try:
            parsed = json.loads(text)
        except ValueError:
            return self.redact(text, where)
        indent = 2 if text.lstrip().startswith(("{\n", "[\n")) else None
        end = "\n" if text.endswith("\n") else ""
        return json.dumps(self.redact_json(parsed, where), indent=indent, ensure_ascii=False) + end

    def ledger(self) -> list[dict[str, object]]:
        """Return what was redacted: one entry per placeholder with its kind and the files
        (and counts) it replaced a value in; never the value itself."""
        return [
            {"placeholder": ph, "kind": self._kinds[ph], "files": dict(sorted(files.items()))}
            for ph, files in sorted(self._counts.items(), key=lambda i: (self._kinds[i[0]], i[0]))
        ]

    # -- helpers -----------------------------------------------------------------------

    def _note(self, ph: str, where: str) -> str:
        files = self._counts.setdefault(ph, {})
        files[where] = files.get(where, 0) + 1
        return ph

    def _secret(self, value: str, where: str) -> str:
        if value.startswith("<secret-"):
            return value
        if self._learning and len(value) >= 8:  # remembered: replaced in every file
            self.add_secret(value)
        return self._note(self.placeholder("secret", value), where)

    def _name(self, kind: str, value: str, where: str) -> str:
        if value.lower() in GENERIC_NAMES:
            return value
        return self._note(self.placeholder(kind, value), where)

    def _assigned(self, m: re.Match[str], where: str) -> str:
        value = m.group("value")
        bare = value.strip("\"'")
        if bare.startswith("<") or bare.lower() in ("", "none", "null", "true", "false", "***"):
            return m.group(0)
        if m.group("sep").strip() == "" and not m.group("key").startswith("-"):
            return m.group(0)  # "token expired": prose, not an assignment
        quote = value[0] if value[0] in "\"'" else ""
        return m.group("key") + m.group("sep") + quote + self._secret(bare, where) + quote

    def _ip(self, text: str, where: str) -> str:
        if not _is_ip(text):
            return text
        address = ipaddress.ip_address(text)
        if address.is_loopback or address.is_unspecified or address.is_link_local:
            return text
        return self._note(self.placeholder("ip", text), where)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
