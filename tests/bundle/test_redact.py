"""The Redactor on planted secrets and identities: every shape replaced, placeholders
stable across files, identities kept only on request, the ledger free of values."""

from __future__ import annotations

import json

import pytest

from gpudoctor.support.redact import Redactor

PLANTED = {
    "hf": "hf_PlantedHuggingFaceToken0123456789",
    "github": "ghp_PlantedGitHubToken0123456789abcdefAB",
    "openai": "sk-proj-PlantedOpenAIKey0123456789abcd",
    "aws": "AKIAPLANTEDAWSKEY123",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJwbGFudGVkIn0.c2lnbmF0dXJlcGxhbnRlZA",
    "bearer": "PlantedBearerCredential0123456789",
    "urlpass": "PlantedUrlPassw0rd",
    "assigned": "PlantedAssignedValue42",
    "quoted": "PlantedQuotedPass99",
    "flag": "PlantedFlagToken77",
}
PEM = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n"
    "-----END OPENSSH PRIVATE KEY-----"
)
TEXT = f"""
HF_TOKEN={PLANTED["hf"]}
git remote: https://x:{PLANTED["github"]}@github.com/org/repo
OPENAI_API_KEY={PLANTED["openai"]}
aws id {PLANTED["aws"]} in a log line
cookie jwt {PLANTED["jwt"]}
Authorization: Bearer {PLANTED["bearer"]}
mirror = https://alice:{PLANTED["urlpass"]}@mirror.example.org/models
db_password = {PLANTED["assigned"]}
{{"api_key": "{PLANTED["quoted"]}"}}
python -m sglang.launch_server --api-key {PLANTED["flag"]}
{PEM}
the token expired at noon
"""


def test_every_planted_secret_is_replaced_even_with_identities_kept() -> None:
    for identities in (True, False):
        out = Redactor(identities=identities).redact(TEXT, "log.txt")
        for name, secret in PLANTED.items():
            assert secret not in out, name
        assert "PRIVATE KEY" not in out and "b3BlbnNzaC1rZXkt" not in out
        assert "the token expired at noon" in out  # prose is not a secret


def test_env_secret_values_are_replaced_in_any_shape() -> None:
    redactor = Redactor()
    redactor.add_secrets_from_env({"MY_SERVICE_SECRET": "opaque-but-secret-42", "HOME": "/root"})
    out = redactor.redact("connected with opaque-but-secret-42 as /root", "a")
    assert "opaque-but-secret-42" not in out
    assert "<secret-1>" in out and "/root" in out


def test_identities_get_stable_placeholders_across_files() -> None:
    redactor = Redactor()
    redactor.add_host("pve-gpu7.corp.example")
    redactor.add_user("alice")
    a = redactor.redact("ssh alice@pve-gpu7.corp.example (10.20.30.40) mac 52:54:00:ab:cd:ef", "a")
    b = redactor.redact("pve-gpu7 at 10.20.30.40 and fd00::1:2; /home/alice/models", "b")
    assert a == "ssh <user-1>@<host-1> (<ip-1>) mac <mac-1>"
    assert b == "<host-2> at <ip-1> and <ip-2>; /home/<user-1>/models"
    assert "127.0.0.1" in redactor.redact("127.0.0.1 ::1 root localhost", "c")
    ledger = redactor.ledger()
    assert {e["placeholder"]: e["files"] for e in ledger}["<ip-1>"] == {"a": 1, "b": 1}
    dumped = json.dumps(ledger)
    for value in ("pve-gpu7", "alice", "10.20.30.40", "52:54:00"):
        assert value not in dumped


def test_no_redact_keeps_identities() -> None:
    redactor = Redactor(identities=False)
    redactor.add_host("pve-gpu7")
    text = "pve-gpu7 10.20.30.40 token=PlantedAssignedValue42"
    assert redactor.redact(text, "a") == "pve-gpu7 10.20.30.40 token=<secret-1>"


@pytest.mark.parametrize("word", ["nvidia", "root", "localhost", "pve"])
def test_generic_names_are_never_hidden(word: str) -> None:
    redactor = Redactor()
    redactor.add_host(word)
    redactor.add_user(word)
    assert redactor.redact(f"{word} here", "a") == f"{word} here"
