"""Host and user names gpudoctor accepts are exactly those the real ``ssh`` accepts
(``ssh -G``: "hostname contains invalid characters", "remote username contains invalid
characters", the CVE-2023-51385 fix): such a name reaches ``%h``/``%r`` in a
ProxyCommand, which a shell runs. Every printable ASCII character, whitespace and control
characters are tried in each place a name can hold them."""

from __future__ import annotations

import shutil
import string
import subprocess

import pytest

from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.ssh.target import check_names, valid_hostname, valid_user

pytestmark = pytest.mark.skipif(not shutil.which("ssh"), reason="needs the OpenSSH client")

CHARS = string.punctuation + " \t\n\x01\x1f\x7fé"


def ssh_accepts(host: str, user: str | None = None) -> bool:
    argv = ["ssh", "-G", "-F", "none", *(["-l", user] if user is not None else []), "--", host]
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert done.returncode == 0 or "invalid characters" in done.stderr, done.stderr
    return done.returncode == 0


def names(shape: str, skip: str = "") -> list[str]:
    return [shape.replace("C", c) for c in CHARS if c not in skip]


def test_host_names_are_judged_as_ssh_judges_them() -> None:
    # '@' and ':' split ssh's destination (user@host:port) before the name is judged
    candidates = [n for shape in ("aCb", "Cab", "abC") for n in names(shape, skip="@:")]
    candidates += ["-ab", "a-b", "a"]
    ours = {name: valid_hostname(name) for name in candidates}
    theirs = {name: ssh_accepts(name) for name in candidates if not name.startswith("-")}
    assert {n: v for n, v in ours.items() if n in theirs} == theirs
    assert not ours["-ab"] and ours["a-b"]


def test_user_names_are_judged_as_ssh_judges_them() -> None:
    candidates = names("aCb") + names("Cab") + names("abC")
    candidates += ["-ab", "a -b", "a\t-b", "a - b", "a b", "ab\\", "a\\b", "a-", "a- b", ""]
    ours = {name: valid_user(name) for name in candidates}
    theirs = {name: ssh_accepts("host", name) for name in candidates}
    assert ours == theirs


def test_a_refused_name_says_which_and_what_ssh_refuses() -> None:
    with pytest.raises(HostError) as caught:
        check_names("pve1;reboot", "root")
    assert str(caught.value) == (
        "bad host 'pve1;reboot': the host name contains characters ssh refuses (a leading "
        "'-', whitespace, control characters or one of '`\"$\\;&<>|(){},)"
    )
    with pytest.raises(HostError) as caught:
        check_names("pve1", "root$(id)")
    assert str(caught.value) == (
        "bad user 'root$(id)': the user name contains characters ssh refuses (a leading "
        "'-', control characters or one of '`\";&<>|(){})"
    )
    check_names("pve1", None)
    check_names("pve1", "ro ot")
