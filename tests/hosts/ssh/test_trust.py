"""Host-key trust decisions without a server: real ed25519/ECDSA keys made by ssh-keygen,
real known_hosts files, :func:`verify_host_key` and :func:`policy_for` as the SSH transport
calls them (the lab tests do the same through a real sshd). Each refusal's text is pinned:
it is what a user reads to decide whether a host was reinstalled or impersonated."""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path

import paramiko
import pytest

from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.ssh.known_hosts import lookup, match_host
from gpudoctor.hosts.ssh.target import SSHTarget
from gpudoctor.hosts.ssh.trust import (
    TrustPolicy,
    host_key_order,
    how_to_accept,
    known_keys,
    policy_for,
    verify_host_key,
)


def keygen(path: Path, kind: str = "ed25519") -> paramiko.PKey:
    """Return the public key of a new ssh-keygen key pair at ``path``."""
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)],
                   check=True, capture_output=True)  # fmt: skip
    kind_name, b64 = path.with_suffix(".pub").read_text().split()[:2]
    return paramiko.PKey.from_type_string(kind_name, base64.b64decode(b64))


def line(name: str, key: paramiko.PKey, marker: str = "") -> str:
    return f"{marker + ' ' if marker else ''}{name} {key.get_name()} {key.get_base64()}\n"


def fp(key: paramiko.PKey) -> str:
    return "FP:" + key.get_base64()[-6:]


TARGET = SSHTarget(alias="pve1", hostname="10.0.0.5", port=2222, user="root")


def verify(key, known_text: str, tmp_path: Path, target: SSHTarget = TARGET, **policy) -> str:
    known = tmp_path / "known_hosts"
    known.write_text(known_text)
    pol = TrustPolicy(**{"mode": "yes", "files": (str(known),), "save_to": None, **policy})
    return verify_host_key(key, target, pol, lookup(target.known_hosts_name, pol.files), fp)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, paramiko.PKey]:
    d = tmp_path_factory.mktemp("keys")
    return {"a": keygen(d / "a"), "b": keygen(d / "b"), "e": keygen(d / "e", "ecdsa")}


def test_a_known_key_is_trusted(keys, tmp_path: Path) -> None:
    assert verify(keys["a"], line("[10.0.0.5]:2222", keys["a"]), tmp_path) == "known host key"


def test_a_revoked_key_is_refused_even_when_also_listed_plain(keys, tmp_path: Path) -> None:
    text = line("[10.0.0.5]:2222", keys["a"]) + line("*", keys["a"], "@revoked")
    with pytest.raises(HostError) as info:
        verify(keys["a"], text, tmp_path)
    assert str(info.value) == (
        f"pve1 (root@10.0.0.5:2222): the SSH host key ssh-ed25519 {fp(keys['a'])} is marked "
        f"@revoked in known_hosts ({tmp_path / 'known_hosts'}:2); refusing it. Ask the host's "
        "admin for its new key"
    )
    other = line("[10.0.0.5]:2222", keys["a"]) + line("elsewhere", keys["a"], "@revoked")
    with pytest.raises(HostError) as info:
        verify(keys["a"], other, tmp_path)
    assert (
        ":2) for other hosts (gpudoctor applies @revoked to every host; ssh would not); "
        "refusing it" in str(info.value)
    )


def test_a_changed_key_of_the_same_type_names_the_line_to_remove(keys, tmp_path: Path) -> None:
    with pytest.raises(HostError) as info:
        verify(keys["b"], "# old\n" + line("[10.0.0.5]:2222", keys["a"]), tmp_path)
    kh = tmp_path / "known_hosts"
    assert str(info.value) == (
        f"pve1 (root@10.0.0.5:2222): the SSH host key has CHANGED: the host now shows "
        f"ssh-ed25519 {fp(keys['b'])} but known_hosts ({kh}:2) holds another ssh-ed25519 key: "
        "a reinstalled host or a man in the middle. If the change is expected, remove the old "
        f"key: ssh-keygen -R '[10.0.0.5]:2222' -f {kh}, then add the new one"
    )


def test_a_key_of_another_type_than_the_known_ones_is_a_change(keys, tmp_path: Path) -> None:
    with pytest.raises(HostError) as info:
        verify(keys["a"], line("[10.0.0.5]:2222", keys["e"]), tmp_path, mode="accept-new",
               save_to=str(tmp_path / "known_hosts"))  # fmt: skip
    message = str(info.value)
    assert "known_hosts holds only ecdsa-sha2-nistp256 for it" in message
    assert message.endswith(
        "remove the old key: ssh-keygen -R '[10.0.0.5]:2222', then add the new one"
    )
    assert (tmp_path / "known_hosts").read_text() == line("[10.0.0.5]:2222", keys["e"])  # unchanged


def test_an_unknown_key_is_refused_with_how_to_add_it(keys, tmp_path: Path) -> None:
    with pytest.raises(HostError) as info:
        verify(keys["a"], line("other", keys["b"]), tmp_path)
    assert str(info.value) == (
        f"pve1 (root@10.0.0.5:2222): unknown SSH host key ssh-ed25519 {fp(keys['a'])} for "
        f"'[10.0.0.5]:2222' (not in {tmp_path / 'known_hosts'}); verify the fingerprint, then "
        "add it: ssh-keyscan -p 2222 10.0.0.5 >> ~/.ssh/known_hosts (or pass --accept-new-host-key)"
    )


@pytest.mark.parametrize("hashed", [False, True])
def test_accept_new_saves_a_never_seen_hosts_key(keys, tmp_path: Path, hashed: bool) -> None:
    save = tmp_path / "saved" / "known_hosts"
    target = SSHTarget(alias="pve1", hostname="10.0.0.5", port=2222, hash_known_hosts=hashed)
    how = verify(keys["a"], "", tmp_path, target, mode="accept-new", save_to=str(save),
                 mode_source="--accept-new-host-key")  # fmt: skip
    assert how == f"new host key saved to {save} (--accept-new-host-key)"
    name, kind, b64 = save.read_text().split()
    assert (kind, b64) == ("ssh-ed25519", keys["a"].get_base64())
    assert name.startswith("|1|") is hashed
    assert match_host(name, "[10.0.0.5]:2222")
    assert lookup("[10.0.0.5]:2222", [str(save)]).plain[0].blob == keys["a"].asbytes()


def test_accept_new_with_nowhere_to_save_refuses(keys, tmp_path: Path) -> None:
    with pytest.raises(HostError, match="unknown SSH host key"):
        verify(keys["a"], "", tmp_path, mode="accept-new", save_to=None)


def test_policy_files_save_target_and_mode(tmp_path: Path) -> None:
    user, user2, glob = str(tmp_path / "u"), str(tmp_path / "u2"), str(tmp_path / "g")
    target = SSHTarget(alias="h", hostname="h", user_known_hosts=(user, user2),
                       global_known_hosts=(glob,), strict_host_key_checking="yes")  # fmt: skip
    assert policy_for(target, None, False) == TrustPolicy("yes", (user, user2, glob), user)
    # --known-hosts naming a configured file: read once, first, and saved to
    assert policy_for(target, user2, False) == TrustPolicy("yes", (user2, user, glob), user2)
    extra = policy_for(target, "~/kh", False)
    home_kh = os.path.expanduser("~/kh")
    assert extra == TrustPolicy("yes", (home_kh, user, user2, glob), home_kh)
    assert policy_for(target, "~/kh", False, use_config_files=False) == TrustPolicy(
        "yes", (home_kh,), home_kh
    )
    assert policy_for(target, None, False, use_config_files=False) == TrustPolicy("yes", (), None)
    assert policy_for(target, None, True) == TrustPolicy(
        "accept-new", (user, user2, glob), user, "--accept-new-host-key"
    )
    for configured in ("accept-new", "no"):
        relaxed = SSHTarget(alias="h", hostname="h", user_known_hosts=(user,),
                            strict_host_key_checking=configured)  # fmt: skip
        assert policy_for(relaxed, None, False) == TrustPolicy(
            "accept-new", (user,), user, f"StrictHostKeyChecking={configured}"
        )
    asking = SSHTarget(alias="h", hostname="h", strict_host_key_checking="ask")
    assert policy_for(asking, None, False).mode == "yes"  # batch mode cannot ask


def test_how_to_accept_names_port_alias_and_file() -> None:
    home = os.path.expanduser("~")
    plain = SSHTarget(alias="h", hostname="h.example", user_known_hosts=(f"{home}/.ssh/kh",))
    assert how_to_accept(plain, TrustPolicy("yes", (), None)) == (
        "verify the fingerprint, then add it: ssh-keyscan h.example >> ~/.ssh/kh "
        "(or pass --accept-new-host-key)"
    )
    aliased = SSHTarget(alias="h", hostname="10.1.1.1", port=2200, host_key_alias="pve-a")
    assert how_to_accept(aliased, TrustPolicy("yes", (), "/etc/kh")) == (
        "verify the fingerprint, then add it: ssh-keyscan -p 2200 10.1.1.1 | sed "
        "'s/^[^ ]*/pve-a/' >> /etc/kh (or pass --accept-new-host-key)"
    )


def test_an_unknown_key_with_no_file_at_all_says_so(keys, tmp_path: Path) -> None:
    pol = TrustPolicy("yes", (), None)
    with pytest.raises(HostError, match=r"\(not in no known_hosts file\)"):
        verify_host_key(keys["a"], TARGET, pol, lookup(TARGET.known_hosts_name, ()), fp)


def test_the_unknown_key_message_lists_every_file_home_as_tilde(keys, tmp_path: Path) -> None:
    home = os.path.expanduser("~")
    files = (f"{home}/.ssh/known_hosts", "/etc/ssh/ssh_known_hosts", f"{home}x/kh")
    pol = TrustPolicy("yes", files, None)
    with pytest.raises(HostError) as info:
        verify_host_key(keys["a"], TARGET, pol, lookup(TARGET.known_hosts_name, ()), fp)
    assert f"(not in ~/.ssh/known_hosts, /etc/ssh/ssh_known_hosts, {home}x/kh); " in str(info.value)


def test_only_a_leading_home_is_shown_as_tilde(keys, tmp_path: Path) -> None:
    """The unknown-key message and its advice shorten the home folder only where a path
    starts with it: a second copy inside the path, or a sibling like /rootx, stays."""
    home = os.path.expanduser("~")
    twice = f"{home}/mirror{home}/known_hosts"
    pol = TrustPolicy("yes", (twice,), twice)
    with pytest.raises(HostError) as info:
        verify_host_key(keys["a"], TARGET, pol, lookup(TARGET.known_hosts_name, ()), fp)
    assert f"(not in ~/mirror{home}/known_hosts); " in str(info.value)
    assert str(info.value).endswith(
        f">> ~/mirror{home}/known_hosts (or pass --accept-new-host-key)"
    )
    sibling = SSHTarget(alias="h", hostname="h", user_known_hosts=(f"{home}x/kh",))
    assert how_to_accept(sibling, TrustPolicy("yes", (), None)).endswith(
        f">> {home}x/kh (or pass --accept-new-host-key)"
    )


def test_a_changed_key_in_a_file_whose_path_has_a_colon_names_that_file(
    keys, tmp_path: Path
) -> None:
    folder = tmp_path / "site:a:b"
    folder.mkdir()
    with pytest.raises(HostError) as info:
        verify(keys["b"], line("[10.0.0.5]:2222", keys["a"]), folder)
    assert str(info.value).endswith(
        f"ssh-keygen -R '[10.0.0.5]:2222' -f {folder / 'known_hosts'}, then add the new one"
    )


def test_a_changed_key_lists_every_known_type(keys, tmp_path: Path) -> None:
    rsa = keygen(tmp_path / "r", "rsa")
    text = line("[10.0.0.5]:2222", rsa) + line("[10.0.0.5]:2222", keys["e"])
    with pytest.raises(
        HostError, match="known_hosts holds only ecdsa-sha2-nistp256, ssh-rsa for it"
    ):
        verify(keys["a"], text, tmp_path)


def test_host_key_order_offers_the_rsa_sha2_algorithms_of_a_known_rsa_key(
    tmp_path: Path,
) -> None:
    """A known ssh-rsa key puts rsa-sha2-512 and rsa-sha2-256 first (the algorithms that
    verify that key), not the SHA-1 ssh-rsa one."""
    known = tmp_path / "kh"
    known.write_text(line("pve1", keygen(tmp_path / "r", "rsa")))
    offered = ("ssh-ed25519", "ssh-rsa", "rsa-sha2-512", "rsa-sha2-256")
    order = host_key_order(lookup("pve1", [str(known)]), offered)
    assert order == ("rsa-sha2-512", "rsa-sha2-256", "ssh-ed25519", "ssh-rsa")


def test_host_key_order_puts_a_known_type_of_its_own_first(tmp_path: Path) -> None:
    """A key type without a table entry (ssh-dss) is its own algorithm."""
    known = tmp_path / "kh"
    known.write_text("pve1 ssh-dss AAAAB3NzaC1kc3M=\n")
    order = host_key_order(lookup("pve1", [str(known)]), ("ssh-ed25519", "ssh-dss"))
    assert order == ("ssh-dss", "ssh-ed25519")


def test_known_keys_reads_the_policy_files_under_the_host_key_alias(keys, tmp_path: Path) -> None:
    known = tmp_path / "kh"
    known.write_text(line("[10.0.0.5]:2222", keys["b"]) + line("pve-a", keys["a"]))
    target = SSHTarget(alias="pve1", hostname="10.0.0.5", port=2222, host_key_alias="pve-a")
    found = known_keys(target, TrustPolicy("yes", (str(known),), None))
    assert [k.blob for k in found.plain] == [keys["a"].asbytes()]
    assert found.files == (str(known),)
