"""Report formats: JSON schema, Prometheus textfile, human text; and the CLI contract."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

from gpudoctor.context import CheckOptions
from gpudoctor.output import Format, render
from gpudoctor.runner import run_checks
from tests.unit.scenarios import incident_ct

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def incident_report():
    return run_checks(incident_ct(511), CheckOptions(ct="200", fix_host="root@pve1"))


def rendered(fmt: Format, verbose: bool = False) -> str:
    out = io.StringIO()
    render([incident_report()], fmt, out, verbose=verbose)
    return out.getvalue()


def test_json_schema_is_versioned_and_complete():
    doc = json.loads(rendered(Format.JSON))
    assert doc["schema"] == "gpudoctor.check/1"
    assert doc["status"] == "FAIL"
    assert {c["check"] for c in doc["checks"]} >= {"device.open", "cuda.init"}
    keys = {
        "check",
        "status",
        "subject",
        "message",
        "evidence",
        "remediation",
        "fix_hint",
        "caused_by",
        "debug",
    }
    assert all(set(f) == keys for f in doc["findings"])


def test_prometheus_textfile_has_one_gauge_per_finding():
    text = rendered(Format.PROMETHEUS)
    lines = [ln for ln in text.splitlines() if ln.startswith("gpudoctor_check_status{")]
    assert len(lines) == len(incident_report().findings)
    assert (
        'gpudoctor_check_status{check="device.open",subject="/dev/nvidia-uvm",target="pve1/ct200"} 3'
        in text
    )
    assert "# TYPE gpudoctor_check_status gauge" in text


def test_human_output_reads_like_the_issue_example():
    text = rendered(Format.HUMAN)
    first = text.splitlines()[0]
    assert first.startswith("FAIL  ")  # problems come first
    assert (
        "FAIL  device.open  /dev/nvidia-uvm (char 511:0, mode 0666) cannot be opened: EPERM. "
        "The node exists and its mode allows access, so the container's cgroup device policy "
        "denies major 511 (nvidia-uvm)."
    ) in text
    assert (
        "remedy: On the host, allow it: lxc.cgroup2.devices.allow: c 511:* rwm   in /etc/pve/lxc/200.conf"
        in text
    )
    assert "or run: gpudoctor fix --host root@pve1 --ct 200" in text
    assert (
        "FAIL  cuda.init  cuInit(0) returned 999 CUDA_ERROR_UNKNOWN (caused by device.open)" in text
    )
    assert "\x1b[" not in text  # no colour when not a terminal


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpudoctor", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def test_cli_exit_codes_on_this_machine():
    """This CI machine has no NVIDIA driver: a FAIL (exit 3) with valid JSON, not a traceback."""
    done = cli("check", "--json")
    assert done.returncode == 3, done.stderr
    doc = json.loads(done.stdout)
    loaded = next(f for f in doc["findings"] if f["check"] == "driver.loaded")
    assert loaded["status"] == "FAIL"
    assert cli("check", "--only", "proc.usable,shm.capacity").returncode == 0
    usage = cli("check", "--only", "nope")
    assert usage.returncode == 2 and "unknown check id" in usage.stderr
    assert "Traceback" not in usage.stderr
    bad = cli("check", "--device", "relative/path")
    assert bad.returncode == 2 and "must be absolute" in bad.stderr


PLUGIN_ERRORS = """
from gpudoctor.model import Severity
from gpudoctor.registry import check

@check(id="acme.boom", title="The ACME probe answers", severity=Severity.HIGH,
       proves="the probe answers", remediation="Restart the ACME agent.")
def acme_boom(ctx):
    raise RuntimeError("the ACME agent is gone")

@check(id="acme.idle", title="The ACME fan is idle", severity=Severity.INFO,
       proves="the fan is idle", remediation="None.")
def acme_idle(ctx):
    yield ctx.skip("fan", "no fan here")
"""


def test_a_run_whose_findings_are_only_error_and_skip_exits_3(tmp_path):
    """A check that raises is ERROR: the run exits 3 (FAILED) like a FAIL, never 0 or 4
    (issue 27). A real installed plug-in distribution, a real `gpudoctor check` process."""
    (tmp_path / "acme_checks.py").write_text(PLUGIN_ERRORS)
    dist = tmp_path / "acme_checks-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-checks\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[gpudoctor.checks]\nacme = acme_checks\n")
    done = cli("check", "--only", "acme", "--json", env={"PYTHONPATH": str(tmp_path)})
    statuses = {f["check"]: f["status"] for f in json.loads(done.stdout)["findings"]}
    assert statuses == {"acme.boom": "ERROR", "acme.idle": "SKIP"}, done.stdout
    assert done.returncode == 3, done.stderr
    from gpudoctor.commands.check import exit_code
    from gpudoctor.model import CheckResult, Finding, Report, Status

    only_error = Report("t", (CheckResult("x.y", (Finding("x.y", Status.ERROR, "s", "m"),)),))
    assert exit_code([only_error]) == 3


def test_prometheus_output_file_is_written_atomically(tmp_path):
    target = tmp_path / "gpudoctor.prom"
    done = cli("check", "--only", "proc.usable", "--format", "prometheus", "-o", str(target))
    assert done.returncode == 0, done.stderr
    assert 'gpudoctor_check_status{check="proc.usable"' in target.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpudoctor.prom"]  # no temp file left


def test_help_imports_no_heavy_module():
    code = (
        "import sys; from gpudoctor.cli import main; main(['--help']);"
        "print(sorted(m for m in ('rich','torch','transformers','paramiko','httpx','huggingface_hub')"
        " if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert "check" in done.stdout and "weights" in done.stdout


def test_check_docs_are_generated_from_the_catalogue():
    """docs/checks/ must match the catalogue: regenerate with `gpudoctor list --markdown docs/checks`."""
    from pathlib import Path

    from gpudoctor.commands.list import check_page, index_page
    from gpudoctor.registry import load_catalogue

    docs = Path(REPO) / "docs" / "checks"
    specs = load_catalogue(include_plugins=False)
    for spec in specs:
        assert (docs / f"{spec.id}.md").read_text() == check_page(spec), spec.id
    assert (docs / "README.md").read_text() == index_page(specs)


def test_or_run_line_left_out_when_the_remedy_already_says_it() -> None:
    """Issue 34.8: a WARN whose remedy names the gpudoctor command printed it twice (the
    remedy, then "or run:" with the same command)."""
    from gpudoctor.model import Finding, Status
    from gpudoctor.output.human import finding_lines

    fix = "gpudoctor fix --host root@pve1 --ct 200"
    same = Finding("ct.device_rules", Status.WARN, "ct 200", "a rule pins major 508",
                   remediation=f"run `{fix}` to migrate to dev0..N", fix_hint=fix)  # fmt: skip
    shown = [line.plain for line in finding_lines(same, verbose=False)]
    assert sum(fix in line for line in shown) == 1, shown
    other = Finding("ct.device_rules", Status.WARN, "ct 200", "a rule pins major 508",
                    remediation="edit /etc/pve/lxc/200.conf", fix_hint=fix)  # fmt: skip
    assert any(line.plain.endswith(f"or run: {fix}") for line in finding_lines(other, False))


PLUGIN_HOSTILE = """
import os
from gpudoctor.model import Severity
from gpudoctor.registry import check

@check(id="acme.motd", title="The CT's message of the day", severity=Severity.HIGH,
       proves="the motd reads", remediation="None.")
def acme_motd(ctx):
    raise RuntimeError(ctx.host.read_text(os.environ["ACME_MOTD"]))
"""


def test_check_output_shows_a_cts_escape_sequences_escaped(tmp_path):
    """Issue 33.6: text a CT chose (here a file its owner wrote, read through the host
    layer by a real plug-in check in a real `gpudoctor check`) carried OSC 52 (clipboard),
    OSC 0 (title) and clear-screen sequences to root's terminal: rich drops BEL and CR but
    passes ESC. Every control character is now shown escaped; JSON escapes them anyway."""
    (tmp_path / "acme_checks.py").write_text(PLUGIN_HOSTILE)
    dist = tmp_path / "acme_checks-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-checks\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[gpudoctor.checks]\nacme = acme_checks\n")
    motd = tmp_path / "motd"
    motd.write_text("hi\x1b]52;c;cm0gLXJmIH4=\x07\x1b]0;pwned\x07\x1b[2J\x1b[Hthere")
    done = cli("check", "--only", "acme", env={"PYTHONPATH": str(tmp_path), "ACME_MOTD": str(motd)})
    assert done.returncode == 3, done.stderr
    assert "\x1b" not in done.stdout and "\x07" not in done.stdout, repr(done.stdout)
    assert "hi\\x1b]52;c;cm0gLXJmIH4=\\x07\\x1b]0;pwned" in done.stdout, done.stdout
