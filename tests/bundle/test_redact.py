"""The Redactor on planted secrets and identities: every shape replaced, placeholders
stable across files, identities kept only on request, the ledger free of values."""

from __future__ import annotations

import json

import pytest

from gpudoctor.redact import Redactor

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


# -- issue 46.2: what passed the redaction ------------------------------------------------

KEY = "PlantedOpaqueApiKey0123456789"


def test_a_value_redacted_once_is_replaced_in_every_file() -> None:
    """An API key found once (``--api-key=KEY`` in a log) is remembered: its JSON-dumped
    argv (``"--api-key", "KEY"``), an escaped log line (``{\\"api_key\\": \\"KEY\\"}``) and a
    bare mention in another file are all replaced. JSON is redacted as parsed values and
    written again with the same layout."""
    record = {"key": "b", "argv": ["vllm", "serve", "--api-key", KEY, "--port", "8000"],
              "server_log_tail": [json.dumps({"api_key": KEY, "model": "m"})],
              "env": {"DB_PASS": "short"}}  # fmt: skip
    texts = [("run/failures.jsonl", json.dumps(record) + "\n"),
             ("logs.txt", f"started with --api-key={KEY}\n"),
             ("notes.txt", f"the key {KEY} again\n"),
             ("status.json", json.dumps({"a": [1, KEY]}, indent=2) + "\n")]  # fmt: skip
    redactor = Redactor()
    out = redactor.redact_all(texts)
    assert all(KEY not in text for text in out)
    again = json.loads(out[0])
    assert again["key"] == "b"  # a bench cell's key is no secret
    assert again["argv"] == ["vllm", "serve", "--api-key", "<secret-1>", "--port", "8000"]
    assert json.loads(again["server_log_tail"][0]) == {"api_key": "<secret-1>", "model": "m"}
    assert again["env"] == {"DB_PASS": "<secret-2>"}
    assert out[1:] == ["started with --api-key=<secret-1>\n", "the key <secret-1> again\n",
                       json.dumps({"a": [1, "<secret-1>"]}, indent=2) + "\n"]  # fmt: skip
    files = {e["placeholder"]: e["files"] for e in redactor.ledger()}
    assert files["<secret-1>"] == {"logs.txt": 1, "notes.txt": 1, "run/failures.jsonl": 2,
                                   "status.json": 1}  # fmt: skip
    assert redactor.redact_all([("x.jsonl", "not json {\n")]) == ["not json {\n"]


@pytest.mark.parametrize("name", ["DB_PASS", "MYSQL_PWD", "SMTP_PW", "pass", "Admin_Password"])
def test_secret_names_include_pass_pwd_and_pw(name: str) -> None:
    redactor = Redactor()
    redactor.add_secrets_from_env({name: "opaque-value-7", "BYPASS_CACHE": "1-keep-me"})
    out = redactor.redact(f"x opaque-value-7 1-keep-me\n{name}=another-value-9\n", "a")
    assert out == f"x <secret-1> 1-keep-me\n{name}=<secret-2>\n"
    assert Redactor().redact("compass=north bypass=on passthrough=yes PWD=/srv", "a") == (
        "compass=north bypass=on passthrough=yes PWD=/srv"
    )
    kept = Redactor()
    kept.add_secrets_from_env({"PWD": "/work/dir", "OLDPWD": "/work/old",
                               "TOKENIZERS_PARALLELISM": "false-ish"})  # fmt: skip
    assert kept.redact("/work/dir /work/old false-ish", "a") == "/work/dir /work/old false-ish"


def test_a_gpus_serial_and_uuid_are_identities() -> None:
    """``nvidia-smi -q``'s serial number and UUIDs, and the driver's "GPU serial number is"
    line: replaced (the same placeholder everywhere), kept with ``--no-redact``."""
    uuid = "GPU-4ac7e3f6-2a1b-7c9d-0e8f-1a2b3c4d5e6f"
    text = (f"    Serial Number                         : 1653723052734\n"
            f"    GPU UUID                              : {uuid}\n"
            f"    MIG UUID : MIG-4ac7e3f6-2a1b-7c9d-0e8f-1a2b3c4d5e60\n"
            "NVRM: GPU 0000:3b:00.0: GPU serial number is 1653723052734.\n")  # fmt: skip
    out = Redactor().redact(text, "nvidia-smi-q.txt")
    assert out.splitlines() == [
        "    Serial Number                         : <serial-1>",
        "    GPU UUID                              : <gpu-1>",
        "    MIG UUID : <gpu-2>",
        "NVRM: GPU 0000:3b:00.0: GPU serial number is <serial-1>.",
    ]
    assert Redactor(identities=False).redact(text, "a") == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("inet6 addr:2001:db8::5/64 Scope:Global", "inet6 addr:<ip-1>/64 Scope:Global"),
        ("from ::ffff:198.51.100.23 port 22", "from <ip-1> port 22"),
        ("peer 2001:db8::7.", "peer <ip-1>."),
        ("at 12:34:56 and ::1 and fe80::1", "at 12:34:56 and ::1 and fe80::1"),
    ],
)
def test_ipv6_addresses_are_replaced_whole(text: str, expected: str) -> None:
    assert Redactor().redact(text, "a") == expected


def test_people_outside_home_and_nvapi_keys() -> None:
    """Every person's login of /etc/passwd (uid 1000 to 60000) and the last part of their
    home directory are user names to hide, wherever they appear; NVIDIA's ``nvapi-`` keys
    are secrets."""
    from gpudoctor.support.bundle import login_users

    passwd = ("root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/nonexistent:/bin/false\n"
              "alice:x:1000:1000::/srv/people/alice-data/:/bin/bash\nsvc:x:999:999::/var/svc:/bin/sh\n"
              "broken line\nbob:x:x:1:::\n")  # fmt: skip
    assert login_users(passwd) == {"alice", "alice-data"}
    redactor = Redactor()
    for user in sorted(login_users(passwd)):
        redactor.add_user(user)
    nvapi = "nvapi-PlantedNvidiaKey_0123456789abcdef"
    out = redactor.redact(f"/srv/people/alice-data/m ssh alice@pve1 key {nvapi}", "a")
    assert out == "/srv/people/<user-1>/m ssh <user-2>@pve1 key <secret-1>"


def test_manifest_source_lines_are_redacted() -> None:
    """MANIFEST.json's sources name the node, the CT and ``/home/<user>`` paths: replaced,
    with the placeholders the files use, and counted under MANIFEST.json."""
    from gpudoctor.support.bundle import build
    from gpudoctor.support.gather import Item

    redactor = Redactor()
    redactor.add_host("pve-node7")
    redactor.add_host("web-ct-7")  # the CT's name (config_names: lxc.uts.name, hostname:)
    items = [Item("ct/lxc.txt", "", "cat /var/lib/lxc/web-ct-7/config"),
             Item("ct/config.txt", "# /etc/pve/nodes/pve-node7/lxc/200.conf\n",
                  "cat /etc/pve/nodes/pve-node7/lxc/200.conf"),
             Item("check.json", "{}\n", f"gpudoctor bench status /home/carol/runs/x token={KEY}")]  # fmt: skip
    done = build(items, redactor, now=0)
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(done.data)) as tar:
        manifest = json.loads(tar.extractfile("gpudoctor-bundle/MANIFEST.json").read())  # type: ignore[union-attr]
    assert [f["source"] for f in manifest["files"]] == [
        "cat /var/lib/lxc/<host-2>/config",
        "cat /etc/pve/nodes/<host-1>/lxc/200.conf",
        "gpudoctor bench status /home/<user-1>/runs/x token=<secret-1>",
    ]
    files = {e["placeholder"]: e["files"] for e in done.ledger}
    assert files["<host-1>"] == {"MANIFEST.json": 1, "ct/config.txt": 1}
    assert files["<host-2>"] == {"MANIFEST.json": 1}
    assert files["<user-1>"] == {"MANIFEST.json": 1}


def test_a_proxmox_description_is_decoded_before_it_is_redacted(tmp_path, monkeypatch) -> None:
    """pmxcfs stores a CT's description as comment lines with ``:`` as ``%3A``: decoded,
    so ``password%3A X`` and ``https%3A//user%3Apw@host`` are seen and replaced; the node
    and the CT's host name are names to hide."""
    from gpudoctor.hosts.local import LocalHost
    from gpudoctor.support.gather import config_names, ct_config
    from tests.fakes.pvetree import PveTree

    tree = PveTree(tmp_path, node="pve-node7")
    tree.add_ct("200", "arch: amd64\n#password%3A Hunter2Secret\n"
                       "#clone https%3A//alice%3AS3cretPw@git.example.org/x 100%25\n"
                       "hostname: ct-web-7\n")  # fmt: skip
    for name, value in tree.env().items():
        monkeypatch.setenv(name, value)
    item = ct_config(LocalHost(), "200", "pve", None)
    assert item.text.splitlines()[1:] == [
        "arch: amd64", "#password: Hunter2Secret",
        "#clone https://alice:S3cretPw@git.example.org/x 100%", "hostname: ct-web-7",
    ]  # fmt: skip
    assert config_names(item.text) == {"pve-node7", "ct-web-7"}
    assert config_names("lxc.uts.name = web\n# /var/lib/lxc/web/config\n") == {"web"}
    out = Redactor().redact(item.text, "ct/config.txt")
    assert "Hunter2Secret" not in out and "S3cretPw" not in out
    (tmp_path / "lxc" / "web").mkdir(parents=True)
    (tmp_path / "lxc" / "web" / "config").write_text("#a%3Ab\nlxc.uts.name = web\n")
    lxc = ct_config(LocalHost(), "web", "lxc", str(tmp_path / "lxc"))
    assert lxc.text.splitlines()[1:] == ["#a%3Ab", "lxc.uts.name = web"]  # LXC: as written
