"""The wheel as users install it: the catalogue inside gpudoctor's namespace, never as a
top-level ``checks`` package, and the ``gpudoctor.checks`` entry-point group still loading
third-party checks. The wheel is really built (hatchling, no network) and imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.cli.support import REPO


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(out), str(REPO)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (found,) = out.glob("gpudoctor-*.whl")
    return found


def test_wheel_holds_the_catalogue_under_gpudoctor_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(p.name for p in (REPO / "checks").glob("*.py"))
    inside = sorted(
        Path(n).name for n in names if n.startswith("gpudoctor/checks/") and n.endswith(".py")
    )
    assert inside == shipped
    assert not [n for n in names if n.startswith("checks/")]  # no top-level package
    tops = {n.split("/")[0] for n in names}
    assert tops <= {"gpudoctor", *(t for t in tops if t.endswith(".dist-info"))}, tops


def test_installed_wheel_loads_its_catalogue_and_plugins(wheel, tmp_path):
    """Unpack the wheel as pip would lay it out, with a third-party plug-in registering a
    check in the ``gpudoctor.checks`` entry-point group, and load the catalogue from there
    (in a fresh interpreter, away from the checkout)."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    (site / "mychecks.py").write_text(
        textwrap.dedent("""
        from gpudoctor.model import Severity
        from gpudoctor.registry import check

        @check(id="mine.ok", title="a plug-in check", severity=Severity.INFO,
               proves="plug-ins load", remediation="none")
        def mine(ctx):
            yield ctx.ok("here", "fine")
    """)
    )
    dist = site / "mychecks-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mychecks\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[gpudoctor.checks]\nmine = mychecks\n")
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(site)!r})
        import gpudoctor, gpudoctor.checks
        from gpudoctor.registry import load_catalogue
        ids = [s.id for s in load_catalogue()]
        print(gpudoctor.__file__)
        print(gpudoctor.checks.__file__)
        print("checks" in sys.modules, "proc.usable" in ids, "mine.ok" in ids)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    package, catalogue, flags = done.stdout.splitlines()
    assert package.startswith(str(site)) and catalogue.startswith(
        str(site / "gpudoctor" / "checks")
    )
    assert flags == "False True True"


def test_console_script_is_the_entry_that_starts_the_probe_then_the_cli(wheel, tmp_path):
    """The wheel's ``gpudoctor`` script is ``gpudoctor.entry:main`` (not a function of
    early_probe, which imports nothing of the CLI), and it runs from the unpacked wheel."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    (points,) = site.glob("gpudoctor-*.dist-info/entry_points.txt")
    text = points.read_text()
    scripts = text.split("[console_scripts]", 1)[1].split("\n[", 1)[0]
    assert scripts.split() == ["gpudoctor", "=", "gpudoctor.entry:main"]
    code = f"import sys; sys.path.insert(0, {str(site)!r}); sys.argv = ['gpudoctor', '-V']\n"
    code += "from gpudoctor.entry import main; main()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("gpudoctor, version ")


def test_wheel_ships_the_ansible_collection_that_ansible_galaxy_builds(wheel, tmp_path):
    """docs/ansible.md: ``ansible-galaxy collection build`` on the installed wheel's
    gpudoctor/ansible_collection gives the gpudoctor.gpu collection, every file of the repo's
    copy in it (galaxy.yml as MANIFEST.json)."""
    import tarfile

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    source = REPO / "gpudoctor" / "ansible_collection"
    wanted = sorted(
        str(p.relative_to(source))
        for p in source.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.name != "galaxy.yml"
    )  # galaxy.yml becomes MANIFEST.json
    built = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-galaxy"), "collection", "build",
         str(site / "gpudoctor" / "ansible_collection"), "--output-path", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    (tarball,) = tmp_path.glob("gpudoctor-gpu-*.tar.gz")
    with tarfile.open(tarball) as archive:
        members = archive.getnames()
    assert sorted(m for m in members if m in wanted) == wanted
    assert "plugins/modules/ct_gpu.py" in wanted and "playbooks/gpu_cts.yml" in wanted
    assert "MANIFEST.json" in members and "FILES.json" in members
