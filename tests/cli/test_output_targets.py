"""Outputs never destroy what is at the path (issue 26.1, 26.8), run as real subprocesses.

Each case puts something that is not gpudoctor's at the output path: a character device (a
private copy of /dev/null made with mknod, so a regression cannot break the machine's own),
a FIFO, a symlink to a victim file, a README.md someone wrote. gpudoctor must refuse with one
line (exit 1) and leave it exactly as it was.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli.support import ERROR_LINE, REPO, gpudoctor, last_line


def planted(tmp_path: Path, kind: str) -> tuple[Path, Path]:
    """Return (output path, what must stay unchanged) with ``kind`` planted at the path."""
    target = tmp_path / "out"
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    if kind == "device":
        os.mknod(target, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # char 1:3 = null
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "symlink":
        target.symlink_to(victim)
    return target, victim


def describe(path: Path) -> tuple[int, int, str]:
    """Return (file type bits, rdev, link target or content) of ``path`` (``stat -c %F``)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return stat.S_IFMT(st.st_mode), 0, os.readlink(path)
    return stat.S_IFMT(st.st_mode), st.st_rdev, ""


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a device node needs root")
@pytest.mark.parametrize("kind", ["device", "fifo", "symlink"])
@pytest.mark.parametrize(
    "command",
    [
        ["check", "--only", "proc", "--format", "prometheus", "-o"],
        ["check", "--only", "proc", "-o"],
        ["service", "rules", "-o"],
    ],
    ids=["check-prometheus", "check", "service-rules"],
)
def test_an_output_option_never_replaces_what_is_not_a_regular_file(tmp_path, kind, command):
    """Blocks: `gpudoctor check -o /dev/null` (or a FIFO, or a symlink planted at the
    output name) turning the node into a regular file / writing through the link."""
    target, victim = planted(tmp_path, kind)
    before = describe(target)
    done = gpudoctor(*command, str(target))
    assert done.returncode == 1, done.stderr
    assert ERROR_LINE.match(last_line(done.stderr)), done.stderr
    assert "writes only to a regular file or a new path" in done.stderr
    assert describe(target) == before
    assert victim.read_text() == "precious\n"


def test_an_output_option_writes_a_regular_file_and_a_new_path(tmp_path):
    """The refusal is not a blanket one: its own earlier file is replaced, a new path
    created."""
    existing = tmp_path / "rules.yml"
    assert gpudoctor("service", "rules", "-o", str(existing)).returncode == 0
    existing.write_text(existing.read_text().replace("GpudoctorCtGpuUnusable", "Stale"))
    assert gpudoctor("service", "rules", "-o", str(existing)).returncode == 0
    assert "GpudoctorCtGpuUnusable" in existing.read_text()
    fresh = tmp_path / "new.prom"
    done = gpudoctor("check", "--only", "proc", "--format", "prometheus", "-o", str(fresh))
    assert done.returncode in (0, 3), done.stderr
    assert "gpudoctor_check" in fresh.read_text()


WRITERS = {
    "check": ["check", "--only", "proc", "-o"],
    "check-json": ["check", "--only", "proc", "--json", "-o"],
    "check-prometheus": ["check", "--only", "proc", "--format", "prometheus", "-o"],
    "bundle": ["bundle", "-o"],
    "service-rules": ["service", "rules", "-o"],
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_an_output_option_never_replaces_a_file_gpudoctor_did_not_write(tmp_path, writer):
    """Issue 47.1: `check -o`, `bundle -o` and `service rules -o` replaced the user's own
    file at that name without a word. Now they refuse (exit 1, one line naming --force)
    and leave it as it was; with --force they replace it."""
    command = WRITERS[writer]
    target = tmp_path / "notes.txt"
    target.write_text("my own notes, not a report\n")
    done = gpudoctor(*command, str(target))
    assert done.returncode == 1, done.stderr
    line = last_line(done.stderr)
    assert ERROR_LINE.match(line), done.stderr
    assert "exists and gpudoctor did not write it; give --force" in line
    assert target.read_text() == "my own notes, not a report\n"

    forced = gpudoctor(*command, str(target), "--force")
    assert forced.returncode in (0, 3), forced.stderr
    assert target.read_bytes() != b"my own notes, not a report\n"


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_an_output_option_replaces_its_own_earlier_file(tmp_path, writer):
    """What gpudoctor wrote at the path (this writer's own output, in each format) is
    replaced without --force, run after run."""
    target = tmp_path / "out"
    for _ in range(2):
        done = gpudoctor(*WRITERS[writer], str(target))
        assert done.returncode in (0, 3), done.stderr


def test_check_o_takes_over_its_own_file_in_another_format(tmp_path):
    """A check report written as JSON may be replaced by the same path in human form
    (the user switched --format): both are gpudoctor's."""
    target = tmp_path / "report"
    assert gpudoctor("check", "--only", "proc", "--json", "-o", str(target)).returncode == 0
    assert gpudoctor("check", "--only", "proc", "-o", str(target)).returncode == 0
    assert target.read_text().startswith("PASS  proc.usable")


def test_list_markdown_never_replaces_a_page_it_did_not_write(tmp_path):
    """Blocks: `gpudoctor list --markdown DIR` overwriting the user's own DIR/README.md.
    Nothing is written when one page is foreign; gpudoctor's own pages are regenerated."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "README.md").write_text("# my project\n")
    done = gpudoctor("list", "--markdown", str(docs))
    assert done.returncode == 1, done.stderr
    assert "README.md exists and gpudoctor did not write it" in last_line(done.stderr)
    assert (docs / "README.md").read_text() == "# my project\n"
    assert sorted(p.name for p in docs.iterdir()) == ["README.md"]  # nothing else written

    own = tmp_path / "checks"
    assert gpudoctor("list", "--markdown", str(own)).returncode == 0
    page = own / "cuda.init.md"
    page.write_text(page.read_text() + "stale line\n")
    assert gpudoctor("list", "--markdown", str(own)).returncode == 0  # its own page: replaced
    assert "stale line" not in page.read_text()


@pytest.mark.parametrize(
    "args",
    [
        ["check", "--json", "--only", "proc"],
        ["bench", "report", "{empty}", "--json"],
        ["bench", "docs/examples/cpu-tiny.toml", "--dry-run", "--no-validate", "--json"],
        ["list", "--json"],
    ],
    ids=["check", "bench-report", "bench-dry-run", "list"],
)
def test_a_full_stdout_is_one_line_not_a_traceback(tmp_path, args):
    """`gpudoctor ... --json > /dev/full`: the write to stdout fails (ENOSPC); the error
    JSON cannot go there either, so stderr gets the one line and the exit code is 1."""
    args = [a.replace("{empty}", str(tmp_path)) for a in args]
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "gpudoctor", *args], stdout=full,
                              stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=120)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert ERROR_LINE.match(last_line(done.stderr)), done.stderr
