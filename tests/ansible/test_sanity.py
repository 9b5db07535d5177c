"""``ansible-test sanity`` passes on the gpudoctor.gpu collection (issue 48): every sanity
test of ansible-core but pslint and shellcheck (no PowerShell or shell file in it), run
locally on this Python in the environments ``python -m tests.ansible.sanity prepare`` made
(tests/run.sh runs it; no network in the test)."""

from __future__ import annotations

import pytest

from tests.ansible import sanity


def test_the_collection_passes_ansible_test_sanity(tmp_path) -> None:
    from tests.conftest import lab_unavailable

    if not sanity.marker().exists():
        lab_unavailable(
            f"ansible-test's sanity environments are not prepared ({sanity.marker()} missing): "
            "run `.venv/bin/python -m tests.ansible.sanity prepare` (tests/run.sh does; its "
            f"output: {sanity.LOG})"
        )
    done = sanity.sanity(sanity.stage(tmp_path))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    ran = [ln for ln in done.stdout.splitlines() if ln.startswith("Running sanity test")]
    names = {ln.split('"')[1] for ln in ran}
    assert {"validate-modules", "pylint", "ansible-doc", "yamllint", "import", "compile"} <= names
    assert not names & set(sanity.SKIPPED)


def test_an_undocumented_option_fails_validate_modules(tmp_path) -> None:
    """The sanity run is not vacuous: an option in the argument spec that DOCUMENTATION
    does not name is found."""
    from tests.conftest import lab_unavailable

    if not sanity.marker().exists():
        lab_unavailable(f"ansible-test's sanity environments are not prepared ({sanity.marker()})")
    collection = sanity.stage(tmp_path)
    module = collection / "plugins" / "modules" / "host_prep.py"
    text = module.read_text()
    planted = text.replace("ARGUMENT_SPEC = {\n", 'ARGUMENT_SPEC = {\n    "undocumented": {},\n')
    assert planted != text  # the option really is planted
    module.write_text(planted)
    done = sanity.sanity(collection, only=("validate-modules",))
    assert done.returncode != 0
    assert "undocumented-parameter" in done.stdout + done.stderr


pytestmark = pytest.mark.timeout(900)
