"""What a support bundle holds, read through a Host: one :class:`Item` per file.

Every reader returns an Item, never raises for what it could not read: an unreadable
file becomes an Item whose text says why (``# could not read /proc/driver/nvidia/version:
No such file or directory``), so a bundle from a broken machine still says what was tried.
The texts are raw here; :mod:`gpudoctor.support.bundle` redacts them before they are written.
"""

from __future__ import annotations

import base64
import json
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpudoctor import __version__
from gpudoctor.hosts.base import Host, HostError

MAX_FILE = 1 << 20  # bytes read of any one file
KERNEL_LOG_LINES = 400  # the last NVIDIA lines of the kernel log kept
RUN_RECORDS_LIMIT = 64 << 20  # bytes of a run's results.jsonl read at most (--run)
_NVIDIA_LINE = re.compile(r"(?i)nvidia|NVRM|\bXid\b|nvlink|nvswitch|\bGPU\b|nv_peer_mem|gdrdrv")
# the environment variables worth a supporter's look (their names; values redacted later)
_ENV_PREFIXES = (
    "CUDA_",
    "NVIDIA_",
    "NCCL_",
    "HF_",
    "HUGGING",
    "TRANSFORMERS_",
    "VLLM_",
    "SGLANG_",
    "TORCH",
    "PYTORCH_",
    "GPUDOCTOR_",
    "LD_LIBRARY_PATH",
    "PATH",
    "LANG",
    "XDG_",
)


@dataclass(frozen=True)
class Item:
    """One file of the bundle: its name inside the archive, its (raw) text, how it was
    obtained (the shell command a supporter would run), and whether gpudoctor refused to
    read it (another user's CT config: the text says why)."""

    name: str
    text: str
    source: str
    refused: bool = False


def read_file(host: Host, path: str, name: str) -> Item:
    """Return ``path`` on ``host`` as an Item (``cat PATH``; at most 1 MiB)."""
    try:
        data = host.read_bytes(path, MAX_FILE)
        return Item(name, data.decode("utf-8", "replace"), f"cat {path}")
    except (OSError, HostError) as exc:
        return Item(name, f"# could not read {path}: {_why(exc)}\n", f"cat {path}")


def run_command(host: Host, argv: list[str], name: str, timeout: float = 20.0) -> Item:
    """Return a command's output on ``host`` as an Item (stdout, then stderr and the exit
    status when it failed)."""
    shown = " ".join(argv)
    try:
        result = host.run(argv, timeout=timeout)
    except HostError as exc:
        return Item(name, f"# could not run {shown}: {exc}\n", shown)
    text = result.stdout
    if not result.ok:
        why = "timed out" if result.timed_out else f"exit {result.returncode}"
        text += f"{result.stderr}\n# {shown}: {why}\n"
    return Item(name, text, shown)


def host_facts(host: Host, prefix: str) -> list[Item]:
    """Return the device facts of ``host`` (kernel, driver, device nodes, modules, the
    NVIDIA kernel-log lines), each Item named ``prefix/...``."""
    items = [
        run_command(host, ["uname", "-a"], f"{prefix}/uname.txt"),
        read_file(host, "/proc/driver/nvidia/version", f"{prefix}/nvidia-driver-version.txt"),
        read_file(host, "/proc/driver/nvidia/params", f"{prefix}/nvidia-params.txt"),
        read_file(host, "/proc/devices", f"{prefix}/proc-devices.txt"),
        read_file(host, "/etc/os-release", f"{prefix}/os-release.txt"),
        run_command(
            host,
            ["sh", "-c", "ls -ln /dev/nvidia* /dev/nvidia-caps /dev/dri 2>&1"],
            f"{prefix}/device-nodes.txt",
        ),
        run_command(
            host,
            ["sh", "-c", "grep -i -E 'nvidia|nv_|gdrdrv' /proc/modules"],
            f"{prefix}/modules.txt",
        ),
        run_command(host, ["nvidia-smi", "-q"], f"{prefix}/nvidia-smi-q.txt", timeout=30),
        kernel_log(host, f"{prefix}/kernel-log-nvidia.txt"),
    ]
    return items


def kernel_log(host: Host, name: str) -> Item:
    """Return the kernel log's NVIDIA lines (the last 400) as an Item: ``journalctl -k -b``
    where journald keeps it, else ``dmesg``, filtered for NVRM/nvidia/Xid/NVLink."""
    for argv in (["journalctl", "-k", "-b", "--no-pager", "-o", "short-iso"], ["dmesg"]):
        try:
            result = host.run(argv, timeout=30)
        except HostError as exc:
            return Item(name, f"# could not read the kernel log: {exc}\n", " ".join(argv))
        logged = [line for line in result.stdout.splitlines() if not line.startswith("-- ")]
        if result.ok and logged:  # journalctl without a journal says "-- No entries --"
            lines = [line for line in logged if _NVIDIA_LINE.search(line)]
            kept = lines[-KERNEL_LOG_LINES:]
            head = f"# {' '.join(argv)} | grep -i -E 'nvidia|NVRM|Xid|nvlink': "
            head += f"{len(kept)} of {len(lines)} matching lines\n"
            return Item(name, head + "\n".join(kept) + "\n", " ".join(argv))
    why = (result.stderr or "").strip() or f"exit {result.returncode}"
    return Item(name, f"# could not read the kernel log (journalctl -k, dmesg): {why}\n", "dmesg")


# Run on the CT's host (as the bundle's user there): the config is opened as a regular
# file only, in its directory as opened (O_NOFOLLOW, O_NONBLOCK: a link to /etc/shadow or a
# FIFO planted in a user's lxcpath is refused, never read or waited on), at most LIMIT + 1
# bytes, and only when that directory belongs to root or the reader and nobody else may
# write it. Prints one JSON object: {"data": base64} or {"refused": why}.
_CONFIG_READER = r"""
import base64, json, os, stat, sys
path, limit = sys.argv[1], int(sys.argv[2])
def say(**kw):
    sys.stdout.write(json.dumps(kw))
    sys.exit(0)
try:
    dfd = os.open(os.path.dirname(path) or "/", os.O_RDONLY | os.O_DIRECTORY)
except OSError as e:
    say(refused=os.path.dirname(path) + ": " + e.strerror)
st = os.fstat(dfd)
if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
    say(refused=os.path.dirname(path) + " belongs to uid %d (mode %04o), not to root or the reader: untrusted, its owner chooses what the config is" % (st.st_uid, stat.S_IMODE(st.st_mode)), untrusted=True)
try:
    fd = os.open(os.path.basename(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
except OSError as e:
    say(refused=path + (" is a symlink" if e.errno == 40 else ": " + e.strerror))
st = os.fstat(fd)
if not stat.S_ISREG(st.st_mode):
    say(refused=path + " is not a regular file")
data = os.read(fd, limit + 1)
if len(data) > limit:
    say(refused=path + " is larger than %d bytes" % limit)
say(data=base64.b64encode(data).decode())
"""


def read_config(host: Host, path: str, limit: int = MAX_FILE) -> bytes:
    """Return the bytes of the CT config ``path`` on ``host``, read as :data:`_CONFIG_READER`
    reads it; raise OSError naming why it was refused (``untrusted`` set on the error when
    its directory is another user's)."""
    result = host.run([host.python, "-I", "-S", "-c", _CONFIG_READER, path, str(limit)], 30)
    try:
        answer = json.loads(result.stdout)
    except ValueError:
        why = (result.stderr.strip() or f"exit {result.returncode}").splitlines()[-1][:200]
        raise OSError(f"cannot read {path}: {why}") from None
    if "data" in answer:
        return base64.b64decode(answer["data"])
    error = OSError(str(answer["refused"]))
    error.untrusted = bool(answer.get("untrusted"))  # type: ignore[attr-defined]
    raise error


def ct_config(host: Host, ct: str, flavor: str, lxcpath: str | None) -> Item:
    """Return CT ``ct``'s config on its host as an Item (``cat /etc/pve/lxc/ID.conf`` or
    ``cat LXCPATH/NAME/config``): a regular file only, from a directory root (or the
    reader) owns; otherwise the Item says why it was left out."""
    from dataclasses import replace

    from gpudoctor.pve.apply import ApplyError, Layout, resolve_target

    layout = Layout.from_env()
    if lxcpath:
        layout = replace(layout, lxcpath=lxcpath)
    try:
        target = resolve_target(host, flavor, ct, layout)
        data = read_config(host, target.config_path)
    except (ApplyError, HostError) as exc:
        return Item("ct/config.txt", f"# CT {ct}'s config could not be read: {exc}\n", "cat CONF")
    except OSError as exc:  # refused: the CT is not entered either
        what = "left out" if getattr(exc, "untrusted", False) else "could not be read"
        return Item("ct/config.txt", f"# CT {ct}'s config {what}: {exc}\n", "cat CONF", True)
    text = data.decode("utf-8", "replace")
    if flavor == "pve":
        text = pmxcfs_comments(text)
    return Item("ct/config.txt", f"# {target.config_path}\n{text}", f"cat {target.config_path}")


def config_names(text: str) -> set[str]:
    """Return the names a CT config gives away: the node of its path
    (``/etc/pve/nodes/NODE/lxc/ID.conf``) and the CT's ``hostname:`` (``lxc.uts.name``)."""
    node = re.search(r"/nodes/([^/\s]+)/lxc/", text)
    names = set(re.findall(r"(?m)^\s*(?:hostname\s*:|lxc\.uts\.name\s*=)\s*(\S+)", text))
    return names | ({node.group(1)} if node else set())


def pmxcfs_comments(text: str) -> str:
    """Return a Proxmox CT config with its comment lines (the CT's description) decoded as
    Proxmox encodes them (``%XX``: ``password%3A X`` is ``password: X``), so the redaction
    sees the text the user wrote."""
    from urllib.parse import unquote

    return "".join(
        unquote(line) if line.startswith("#") else line for line in text.splitlines(True)
    )


def environment(environ: dict[str, str]) -> Item:
    """Return the GPU-relevant variables of ``environ`` as an Item (``env | grep ...``);
    secret-named ones show ``<set>`` instead of their value."""
    from gpudoctor.redact import SECRET_NAME

    lines = []
    for name in sorted(environ):
        if not name.startswith(_ENV_PREFIXES):
            continue
        value = "<set, value withheld>" if SECRET_NAME.search(name) else environ[name]
        lines.append(f"{name}={value}")
    return Item("local/environment.txt", "\n".join(lines) + "\n", "env | grep -E 'CUDA|NVIDIA|..'")


def versions() -> Item:
    """Return gpudoctor's, Python's and this machine's versions as an Item."""
    facts = {
        "gpudoctor": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
    }
    return Item("local/versions.json", json.dumps(facts, indent=2) + "\n", "gpudoctor --version")


def last_run(run: Path) -> list[Item]:
    """Return a bench run's status (``bench status RUN --json``) and its failed cells
    (every ``results.jsonl`` record whose status is not ``ok``, server log tails included)
    as Items."""
    from gpudoctor.bench.launch.status import campaign_status
    from gpudoctor.bench.results.run_dir import RESULTS, RunDirError, read_records

    status: dict[str, Any] = campaign_status(run)
    try:  # another user's run: a link, a FIFO or a huge file is named, never read (46.8)
        records, _torn = read_records(run / RESULTS, limit=RUN_RECORDS_LIMIT)
    except RunDirError as exc:
        records, text = [], f"# not read: {exc}\n"
    else:
        text = ""
    failed = [r for r in records if r.get("status") != "ok"]
    text += "".join(json.dumps(r, sort_keys=True) + "\n" for r in failed)
    return [
        Item(
            "run/status.json",
            json.dumps(status, indent=2, default=str) + "\n",
            f"gpudoctor bench status {run} --json",
        ),
        Item("run/failures.jsonl", text or "", f'grep -v \'"status": "ok"\' {run}/{RESULTS}'),
    ]


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
