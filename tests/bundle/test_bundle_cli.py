"""``gpudoctor bundle`` as a real subprocess: the archive's contents, and no planted
secret anywhere in it (environment, a bench run's server log, the kernel log)."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.cli.support import ERROR_LINE, gpudoctor, last_line

ENV_TOKEN = "hf_PlantedEnvToken0123456789abcdef"
CUSTOM_SECRET = "opaque-planted-secret-value-31337"
LOG_TOKEN = "ghp_PlantedLogToken0123456789abcdefABCD"
LOG_IP = "10.77.66.55"


def named(name: str, text: str) -> bool:
    """Return True when ``name`` occurs in ``text`` as a whole word (a short host name
    such as ``vm`` is also part of ``nvml``)."""
    return re.search(rf"(?<![A-Za-z0-9_-]){re.escape(name)}(?![A-Za-z0-9_-])", text) is not None


def members(path: Path) -> dict[str, str]:
    """Return every file of the archive at ``path``: name -> text."""
    with tarfile.open(path) as tar:
        return {
            m.name: tar.extractfile(m).read().decode()  # type: ignore[union-attr]
            for m in tar.getmembers()
        }


def planted_run(root: Path) -> Path:
    """A bench run directory with one ok and one crashed cell whose server log tail
    holds a token, an IP and this machine's host name."""
    run = root / "run"
    run.mkdir()
    ok = {"key": "a", "status": "ok", "config": "c1", "concurrency": 1, "tp": 1}
    crashed = {
        "key": "b", "status": "crashed", "config": "c1", "concurrency": 8, "tp": 1,
        "reason": "server exited 1",
        "server_log_tail": [f"login with token={LOG_TOKEN} from {LOG_IP}",
                            f"CUDA error on {socket.gethostname()}: out of memory"],
    }  # fmt: skip
    (run / "results.jsonl").write_text(json.dumps(ok) + "\n" + json.dumps(crashed) + "\n")
    return run


def test_local_bundle_holds_the_facts_and_no_planted_secret(tmp_path: Path) -> None:
    out = tmp_path / "b.tar.gz"
    run = planted_run(tmp_path)
    env = {"HF_TOKEN": ENV_TOKEN, "ACME_SECRET": CUSTOM_SECRET, "NCCL_DEBUG": "INFO"}
    done = gpudoctor("bundle", "-o", str(out), "--run", str(run), env=env)
    assert done.returncode == 0, done.stderr
    assert f"wrote {out}" in done.stdout
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    files = members(out)
    names = {n.removeprefix("gpudoctor-bundle/") for n in files}
    assert {"check.json", "local/uname.txt", "local/kernel-log-nvidia.txt",
            "local/nvidia-driver-version.txt", "local/versions.json", "local/environment.txt",
            "run/status.json", "run/failures.jsonl", "MANIFEST.json",
            "REDACTED.json"} <= names  # fmt: skip
    everything = "\n".join(files.values())
    for planted in (ENV_TOKEN, CUSTOM_SECRET, LOG_TOKEN, LOG_IP, socket.gethostname()):
        assert not named(planted, everything), planted
    assert json.loads(files["gpudoctor-bundle/check.json"])["schema"] == "gpudoctor.check/1"
    failures = [
        json.loads(line)
        for line in files["gpudoctor-bundle/run/failures.jsonl"].split("\n")
        if line
    ]
    assert [f["key"] for f in failures] == ["b"]  # the failed cell only
    tail = failures[0]["server_log_tail"]
    assert tail[0] == "login with token=<secret-1> from <ip-1>"
    assert tail[1] == "CUDA error on <host-1>: out of memory"
    assert "HF_TOKEN=<set, value withheld>" in files["gpudoctor-bundle/local/environment.txt"]
    assert "NCCL_DEBUG=INFO" in files["gpudoctor-bundle/local/environment.txt"]
    ledger = json.loads(files["gpudoctor-bundle/REDACTED.json"])["redacted"]
    by_ph = {e["placeholder"]: e for e in ledger}
    assert by_ph["<ip-1>"]["files"] == {"run/failures.jsonl": 1}
    assert by_ph["<host-1>"]["kind"] == "host"


def test_no_redact_keeps_names_but_never_a_secret(tmp_path: Path) -> None:
    out = tmp_path / "b.tar.gz"
    run = planted_run(tmp_path)
    done = gpudoctor("bundle", "-o", str(out), "--run", str(run), "--no-redact", "--json",
                     env={"HF_TOKEN": ENV_TOKEN})  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["identities_redacted"] is False
    everything = "\n".join(members(out).values())
    assert LOG_IP in everything and named(socket.gethostname(), everything)
    assert ENV_TOKEN not in everything and LOG_TOKEN not in everything


@pytest.mark.skipif(not os.access("/dev/kmsg", os.W_OK), reason="needs root to write /dev/kmsg")
def test_a_token_in_the_kernel_log_is_replaced(tmp_path: Path) -> None:
    """Plants a line in the REAL kernel log (``echo ... > /dev/kmsg``, what a driver's
    printk does) and finds it, redacted, among the bundle's NVIDIA lines."""
    marker = f"NVRM: gpudoctor-bundle-test {os.getpid()} token={LOG_TOKEN}"
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(marker + "\n")
    out = tmp_path / "b.tar.gz"
    assert gpudoctor("bundle", "-o", str(out)).returncode == 0
    log = members(out)["gpudoctor-bundle/local/kernel-log-nvidia.txt"]
    assert f"NVRM: gpudoctor-bundle-test {os.getpid()} token=<secret-1>" in log
    assert LOG_TOKEN not in log


def test_unwritable_output_is_one_line_error(tmp_path: Path) -> None:
    done = gpudoctor("bundle", "-o", str(tmp_path / "missing" / "b.tar.gz"))
    assert done.returncode == 1
    assert ERROR_LINE.match(last_line(done.stderr)), done.stderr
    assert not (tmp_path / "missing").exists()


def test_archive_is_a_valid_gzip_tar_with_one_root(tmp_path: Path) -> None:
    out = tmp_path / "b.tar.gz"
    assert gpudoctor("bundle", "-o", str(out), "--json").returncode == 0
    with tarfile.open(fileobj=io.BytesIO(out.read_bytes()), mode="r:gz") as tar:
        assert {m.name.split("/")[0] for m in tar.getmembers()} == {"gpudoctor-bundle"}
        assert all(m.isfile() and m.mode == 0o600 for m in tar.getmembers())


def test_a_proxmox_description_an_api_key_and_a_pass_variable_never_reach_the_archive(
    tmp_path: Path,
) -> None:
    """Issue 46.2 on the real CLI: a CT description as pmxcfs stores it (``password%3A X``,
    ``https%3A//user%3Apw@host``), an API key a crashed cell's argv and its JSON log line
    hold (replaced once in failures.jsonl on the code before, in clear twice), a
    ``VLLM_DB_PASS`` variable, the node and the CT's host name: none is in the archive."""
    from tests.fakes.pvetree import PveTree

    tree = PveTree(tmp_path, node="pve-node7")
    tree.add_ct("200", "arch: amd64\n#password%3A Hunter2Secret\n"
                       "#clone https%3A//alice%3AS3cretPw@git.example.org/x\nhostname: ct-web-7\n")  # fmt: skip
    key = "PlantedOpaqueApiKey0123456789"
    run = tmp_path / "run"
    run.mkdir()
    crashed = {"key": "b", "status": "crashed", "config": "c1", "concurrency": 1, "tp": 1,
               "argv": ["vllm", "serve", "m", "--api-key", key],
               "server_log_tail": [json.dumps({"api_key": key}), f"--api-key={key}"]}  # fmt: skip
    (run / "results.jsonl").write_text(json.dumps(crashed) + "\n")
    out = tmp_path / "b.tar.gz"
    env = {**tree.env(), "VLLM_DB_PASS": "PlantedDbPassword77"}
    done = gpudoctor("bundle", "--ct", "200", "--timeout", "5", "-o", str(out), "--run",
                     str(run), env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    files = members(out)
    everything = "\n".join(files.values())
    for planted in ("Hunter2Secret", "S3cretPw", key, "PlantedDbPassword77", "pve-node7",
                    "ct-web-7"):  # fmt: skip
        assert planted not in everything, planted
    config = files["gpudoctor-bundle/ct/config.txt"].splitlines()
    assert config[2:4] == [
        "#password: <secret-2>",
        "#clone https://alice:<secret-1>@git.example.org/x",
    ]
    (failure,) = [
        json.loads(line) for line in files["gpudoctor-bundle/run/failures.jsonl"].splitlines()
    ]
    assert failure["argv"][-1] == failure["server_log_tail"][1].removeprefix("--api-key=")
    assert "VLLM_DB_PASS=<set, value withheld>" in files["gpudoctor-bundle/local/environment.txt"]


def _as_nobody(script: str) -> None:
    command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    subprocess.run([*command, "sh", "-c", script], check=True, capture_output=True)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="the attack needs root as the victim and setpriv")  # fmt: skip
@pytest.mark.parametrize("plant", ["link", "fifo", "own-dir"])
def test_a_users_ct_config_is_never_a_way_to_root_only_files(
    public_tmp_path: Path, plant: str
) -> None:
    """Issue 46.3: plain LXC with an lxcpath nobody owns. nobody's ``web/config`` is a link
    to a root-only file (on the code before, its bytes went into ct/config.txt), or a FIFO
    (the bundle blocked for good), or a plain file in nobody's directory (its owner can
    make it a link at any moment): root's ``bundle --ct web --lxcpath LXCPATH`` leaves it
    out and says why, exit 0, within its deadline."""
    secret = public_tmp_path / "root-only"
    secret.write_text("root:$6$PlantedShadowHash:19000:0:99999:7:::\n")
    secret.chmod(0o600)
    lxcpath = public_tmp_path / "lxc"
    lxcpath.mkdir()
    os.chown(lxcpath, 65534, 65534)
    make = {"link": f"ln -s {secret} {lxcpath}/web/config",
            "fifo": f"mkfifo {lxcpath}/web/config",
            "own-dir": f"echo 'lxc.uts.name = web' > {lxcpath}/web/config"}[plant]  # fmt: skip
    _as_nobody(f"mkdir {lxcpath}/web && {make}")
    out = public_tmp_path / "b.tar.gz"
    done = gpudoctor("bundle", "--ct", "web", "--flavor", "lxc", "--lxcpath", str(lxcpath),
                     "--timeout", "5", "-o", str(out), timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    config = members(out)["gpudoctor-bundle/ct/config.txt"]
    assert "PlantedShadowHash" not in config
    assert config == (
        f"# CT web's config left out: {lxcpath}/web belongs to uid 65534 (mode 0755), not to"
        " root or the reader: untrusted, its owner chooses what the config is\n"
    )


def test_a_link_or_fifo_as_a_trusted_ct_config_is_refused(tmp_path: Path) -> None:
    """In a directory root owns, a config that is a link or a FIFO is not read (nor waited
    on); a regular one is, at most 1 MiB."""
    from gpudoctor.hosts.local import LocalHost
    from gpudoctor.support.gather import ct_config

    lxcpath = tmp_path / "lxc"
    for name in ("link", "fifo", "big", "ok"):
        (lxcpath / name).mkdir(parents=True)
    (lxcpath / "link" / "config").symlink_to(lxcpath / "ok" / "config")
    os.mkfifo(lxcpath / "fifo" / "config")
    (lxcpath / "big" / "config").write_bytes(b"#" * ((1 << 20) + 1))
    (lxcpath / "ok" / "config").write_text("lxc.uts.name = ok\n")
    said = {
        n: ct_config(LocalHost(), n, "lxc", str(lxcpath)).text
        for n in ("link", "fifo", "big", "ok")
    }
    assert said == {
        "link": f"# CT link's config could not be read: {lxcpath}/link/config is a symlink\n",
        "fifo": f"# CT fifo's config could not be read: {lxcpath}/fifo/config is not a regular file\n",
        "big": f"# CT big's config could not be read: {lxcpath}/big/config is larger than 1048576 bytes\n",
        "ok": f"# {lxcpath}/ok/config\nlxc.uts.name = ok\n",
    }


def _limited() -> None:
    """The child's address space is capped (2 GiB): an unbounded read dies, not the box."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="the attack needs root as the victim and setpriv")  # fmt: skip
@pytest.mark.parametrize(
    ("plant", "why"),
    [("truncate -s 1G {run}/results.jsonl", "is larger than 64 MiB"),
     ("ln -s {secret} {run}/results.jsonl", "is a symlink"),
     ("mkfifo {run}/results.jsonl", "is a FIFO")],
)  # fmt: skip
def test_another_users_run_is_read_bounded_and_a_link_is_named(
    public_tmp_path: Path, plant: str, why: str
) -> None:
    """Issue 46.8: ``bundle --run DIR`` where nobody made DIR: a 1 GiB sparse
    results.jsonl was read whole (2.1 GB RSS; here, under a 2 GiB address-space cap, the
    bundle died), a link made the whole bundle fail. Now at most 64 MiB is read, and a
    link or FIFO is named in run/failures.jsonl; the bundle is written."""
    public = public_tmp_path / "public"
    public.mkdir()
    os.chmod(public, 0o1777)
    secret = public_tmp_path / "root-only"
    secret.write_text('{"key": "x", "status": "crashed", "reason": "PlantedRootOnly"}\n')
    secret.chmod(0o600)
    run = public / "run"
    _as_nobody(f"mkdir {run} && " + plant.format(run=run, secret=secret))
    out = public_tmp_path / "b.tar.gz"
    done = subprocess.run([sys.executable, "-m", "gpudoctor", "bundle", "-o", str(out), "--run", str(run)],
                          capture_output=True, text=True, timeout=180, preexec_fn=_limited)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    failures = members(out)["gpudoctor-bundle/run/failures.jsonl"]
    assert failures.startswith(f"# not read: {run}/results.jsonl {why}")
    assert "PlantedRootOnly" not in failures


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="the attack needs root as the victim and setpriv")  # fmt: skip
def test_a_directory_link_nobody_planted_above_output_is_refused(public_tmp_path: Path) -> None:
    """Issue 46.10: nobody plants ``/tmp/x -> DIR`` (a directory only root may write)
    before root runs ``bundle -o /tmp/x/b.tar.gz``; on the code before, the archive (and
    with ``check -o`` a report) was written where nobody chose. Refused, one line."""
    public = public_tmp_path / "public"
    public.mkdir()
    os.chmod(public, 0o1777)
    chosen = public_tmp_path / "root-only"
    chosen.mkdir(mode=0o700)
    _as_nobody(f"ln -s {chosen} {public}/x")
    for argv in (["bundle", "-o"], ["check", "--only", "host.xid", "--format", "json", "-o"]):
        done = gpudoctor(*argv, str(public / "x" / "out"))
        assert done.returncode == 1, (argv, done.stdout, done.stderr)
        assert ERROR_LINE.match(last_line(done.stderr)), done.stderr
        assert f"{public}/x (above -o) is a symlink of nobody (uid 65534)" in done.stderr
        assert os.listdir(chosen) == []
