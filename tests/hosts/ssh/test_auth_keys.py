"""Which keys gpudoctor offers a server, in which order, and why it skips the others
(:func:`candidate_keys`, as ``ssh -o BatchMode=yes`` would offer them): real key files and
user certificates made by ``ssh-keygen``, a real ``ssh-agent`` on a socket in tmp_path."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import paramiko
import pytest

from gpudoctor.hosts.ssh.auth import Credentials, candidate_keys, open_agent
from gpudoctor.hosts.ssh.target import SSHTarget
from tests.support.signals import default_signals

pytestmark = pytest.mark.skipif(
    not (shutil.which("ssh-keygen") and shutil.which("ssh-agent")), reason="needs OpenSSH"
)


def keygen(path: Path, kind: str = "ed25519", passphrase: str = "") -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", passphrase, "-C", f"{path.name}-comment",
                    "-f", str(path)], check=True, capture_output=True)  # fmt: skip
    return str(path)


def certify(ca: str, key: str, out: str | None = None) -> str:
    """Sign ``key.pub`` as a user certificate; return its path (moved to ``out``)."""
    subprocess.run(["ssh-keygen", "-q", "-s", ca, "-I", "me", "-n", "root", f"{key}.pub"],
                   check=True, capture_output=True)  # fmt: skip
    made = f"{key}-cert.pub"
    if out:
        os.rename(made, out)
        return out
    return made


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[str]:
    """A real ssh-agent listening on ``tmp_path/agent.sock``; yields the socket path."""
    sock = str(tmp_path / "agent.sock")
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", sock], stdout=subprocess.PIPE, text=True,
                            preexec_fn=default_signals)  # fmt: skip
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # "SSH_AUTH_SOCK=...": printed once the socket listens
        assert os.path.exists(sock)
        yield sock
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def ssh_add(sock: str, *keys: str) -> None:
    subprocess.run(["ssh-add", "-q", *keys], check=True, capture_output=True,
                   env={**os.environ, "SSH_AUTH_SOCK": sock})  # fmt: skip


NO_CREDENTIALS = Credentials()


def labels(target: SSHTarget, creds: Credentials = NO_CREDENTIALS, agent_path: str | None = None):
    agent = (
        open_agent(target)
        if agent_path is None
        else open_agent(SSHTarget(**{**target.__dict__, "identity_agent": agent_path}))
    )
    try:
        keys, notes = candidate_keys(target, creds, agent)
    finally:
        if agent is not None:
            agent.close()
    return [label for label, _key in keys], notes, keys


def test_key_files_are_offered_in_order_and_each_skip_says_why(tmp_path: Path) -> None:
    a = keygen(tmp_path / "a")
    given = keygen(tmp_path / "given", "ecdsa")
    locked = keygen(tmp_path / "locked", passphrase="secret")
    junk = tmp_path / "junk"
    junk.write_text("not a key\n")
    pub_only = keygen(tmp_path / "pubonly")
    os.remove(pub_only)
    copy = tmp_path / "a-copy"
    shutil.copy(a, copy)
    target = SSHTarget("pve1", "10.0.0.5", identity_agent="none",
                       identity_files=(a, given, locked, str(junk), f"{pub_only}.pub",
                                       str(tmp_path / "missing"), str(copy)))  # fmt: skip
    names, notes, keys = labels(target, Credentials(key_filename=given))
    assert names == [given, a]
    assert notes == [
        f"{locked} is encrypted (load it into ssh-agent: ssh-add {locked})",
        f"{junk} cannot be loaded (ValueError)",
        f"{pub_only}.pub is a public key and no ssh-agent is reachable",
    ]
    assert [k.get_name() for _l, k in keys] == ["ecdsa-sha2-nistp256", "ssh-ed25519"]
    names, notes, _keys = labels(target, Credentials(key_filename=given, passphrase="secret"))
    assert names == [given, a, locked]  # the passphrase opens the encrypted key only
    assert len(notes) == 2
    names, notes, _keys = labels(target, Credentials(key_filename=given, passphrase="wrong"))
    assert names == [given, a] and notes[0] == f"{locked} cannot be loaded (ValueError)"


def test_an_encrypted_pem_key_is_named_as_encrypted(tmp_path: Path) -> None:
    """The legacy PEM format (``ssh-keygen -m PEM``) as the OpenSSH one."""
    locked = tmp_path / "legacy"
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-m", "PEM", "-N", "secret", "-f",
                    str(locked)], check=True, capture_output=True)  # fmt: skip
    target = SSHTarget("pve1", "10.0.0.5", identity_agent="none", identity_files=(str(locked),))
    assert labels(target)[:2] == (
        [],
        [f"{locked} is encrypted (load it into ssh-agent: ssh-add {locked})"],
    )
    assert labels(target, Credentials(passphrase="secret"))[:2] == ([str(locked)], [])


def test_the_identity_given_on_the_command_line_is_expanded_and_tried_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".ssh").mkdir()
    mine = keygen(tmp_path / ".ssh" / "mine")
    other = keygen(tmp_path / "other")
    target = SSHTarget("pve1", "10.0.0.5", identity_agent="none", identity_files=(other,))
    names, notes, _keys = labels(target, Credentials(key_filename="~/.ssh/mine"))
    assert (names, notes) == ([mine, other], [])


def test_a_certificate_is_offered_before_its_key(tmp_path: Path) -> None:
    """``IDENTITY-cert.pub`` beside a key and ``CertificateFile`` elsewhere both pair with
    the key they certify; a certificate of no configured key is not offered."""
    ca = keygen(tmp_path / "ca")
    beside = keygen(tmp_path / "beside")
    certify(ca, beside)
    elsewhere = keygen(tmp_path / "elsewhere", "rsa")
    cert_file = certify(ca, elsewhere, str(tmp_path / "elsewhere.certificate"))
    plain = keygen(tmp_path / "plain")
    stranger = keygen(tmp_path / "stranger")
    stray = certify(ca, stranger, str(tmp_path / "stray.certificate"))
    broken = tmp_path / "broken.certificate"
    broken.write_text("ssh-ed25519-cert-v01@openssh.com !!!\n")
    target = SSHTarget("pve1", "10.0.0.5", identity_agent="none",
                       identity_files=(beside, elsewhere, plain),
                       certificate_files=(stray, str(broken), cert_file,
                                          str(tmp_path / "absent")))  # fmt: skip
    names, notes, keys = labels(target)
    assert names == [f"{beside} + certificate", beside, f"{elsewhere} + certificate", elsewhere,
                     plain]  # fmt: skip
    assert notes == []
    blobs = [getattr(k, "public_blob", None) for _l, k in keys]
    assert blobs[0].key_type == "ssh-ed25519-cert-v01@openssh.com"
    assert blobs[2].key_type == "ssh-rsa-cert-v01@openssh.com"
    assert blobs[1] is None and blobs[3] is None and blobs[4] is None
    assert blobs[2].key_blob == paramiko.PublicBlob.from_file(cert_file).key_blob


def test_agent_keys_follow_the_configured_ones_unless_identities_only(
    tmp_path: Path, agent: str
) -> None:
    held = keygen(tmp_path / "held")
    extra = keygen(tmp_path / "extra")
    unheld = keygen(tmp_path / "unheld")
    os.remove(unheld)
    ssh_add(agent, held, extra)
    os.remove(held)  # only held.pub is left: the agent signs for it
    files = (f"{held}.pub", f"{unheld}.pub")
    target = SSHTarget("pve1", "10.0.0.5", identity_files=files)
    names, notes, _keys = labels(target, agent_path=agent)
    assert names == [f"agent key for {held}.pub", "agent key extra-comment"]
    assert notes == [f"{unheld}.pub is a public key and the ssh-agent does not hold it"]
    only = SSHTarget("pve1", "10.0.0.5", identity_files=files, identities_only=True)
    assert labels(only, agent_path=agent)[0] == [f"agent key for {held}.pub"]


def test_the_agent_comes_from_identity_agent_or_the_environment(
    tmp_path: Path, agent: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = SSHTarget("pve1", "10.0.0.5")
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    assert open_agent(target) is None
    monkeypatch.setenv("SSH_AUTH_SOCK", agent)
    assert open_agent(target) is None  # reachable but empty: no agent to offer
    ssh_add(agent, keygen(tmp_path / "k"))
    found = open_agent(target)
    assert found is not None and [k.comment for k in found.get_keys()] == ["k-comment"]
    found.close()
    assert open_agent(SSHTarget("pve1", "10.0.0.5", identity_agent="none")) is None
    (tmp_path / "none").symlink_to(agent)  # "none" is a word there, never a path
    monkeypatch.chdir(tmp_path)
    assert open_agent(SSHTarget("pve1", "10.0.0.5", identity_agent="none")) is None
    not_a_socket = tmp_path / "file"
    not_a_socket.write_text("")
    assert open_agent(SSHTarget("pve1", "10.0.0.5", identity_agent=str(not_a_socket))) is None
    monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "gone"))
    assert open_agent(target) is None
    via_config = open_agent(SSHTarget("pve1", "10.0.0.5", identity_agent=agent))
    assert via_config is not None
    via_config.close()


def test_the_agent_signs_for_an_identity_whatever_its_public_key_line_looks_like(
    tmp_path: Path, agent: str
) -> None:
    """``IdentityFile`` names a key the agent holds: it is offered from the agent (the
    private file is not even opened: encrypted is fine) when ``IDENTITY.pub`` or the
    identity itself holds its public key line: any key type, a comment that is not ASCII
    or looks like a key type, options in front (an authorized_keys line pasted in), a
    certificate line or a damaged line ahead of the key's own."""
    locked = keygen(tmp_path / "locked")
    other = keygen(tmp_path / "other")
    ecdsa = keygen(tmp_path / "ecdsa", "ecdsa")
    ssh_add(agent, locked, other, ecdsa)
    subprocess.run(["ssh-keygen", "-q", "-p", "-P", "", "-N", "secret", "-f", locked],
                   check=True, capture_output=True)  # fmt: skip
    lkind, lblob, _ = Path(f"{locked}.pub").read_text().split()
    Path(f"{locked}.pub").write_text(f"{lkind} {lblob}\n")  # made with -C "": no comment
    kind, blob, _comment = Path(f"{other}.pub").read_text().split()
    Path(f"{other}.pub").write_text(f"{kind} {blob} Jürgen's laptop ssh-laptop\n", "utf-8")
    ekind, eblob, _ = Path(f"{ecdsa}.pub").read_text().split()
    pasted = tmp_path / "pasted"  # no private file, no pasted.pub: the line is the identity
    cert_line = Path(certify(keygen(tmp_path / "ca"), ecdsa)).read_text()
    pasted.write_text(
        f"{cert_line}ssh-ed25519 AAAA-damaged-AAAAA\nssh-ed25519 AAAA\u00e9AAA\n"
        f'restrict,command="uptime" {ekind} {eblob} ops\n'
    )
    truncated = tmp_path / "truncated"  # a public key line cut after its type
    truncated.write_text("ssh-ed25519\n")
    target = SSHTarget("pve1", "10.0.0.5", identities_only=True,
                       identity_files=(locked, other, str(pasted), str(truncated)))  # fmt: skip
    names, notes, keys = labels(target, agent_path=agent)
    assert names == [f"agent key for {locked}", f"agent key for {other}", f"agent key for {pasted}"]
    assert notes == [f"{truncated} cannot be loaded (ValueError)"]
    assert all(isinstance(k, paramiko.AgentKey) for _l, k in keys)


def test_an_agent_socket_nobody_listens_on_is_closed_at_once(tmp_path: Path) -> None:
    """``IdentityAgent`` names a dead socket (the agent is gone, the file is left): no
    agent, and the socket opened to try it is closed then, not left to the garbage
    collector (which warns about an unclosed socket: an fd held meanwhile)."""
    import gc
    import socket
    import warnings

    dead = tmp_path / "dead.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(dead))  # bound, never listening: connect() is refused
    gc.collect()  # earlier tests' garbage warns now, not below
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        assert open_agent(SSHTarget("pve1", "10.0.0.5", identity_agent=str(dead))) is None
    assert [str(w.message) for w in caught if w.category is ResourceWarning] == []
