"""The exit codes, one set: the README's table, each command's ``--help``, the docs and the
code all agree with :class:`gpudoctor.exit_codes.ExitCode`.

Each test fails when a number changes on one side only: the README's column of a code no
longer matches the enum member the command's code returns, a ``--help`` lists a number the
command does not document, or a command's code returns a member its row leaves empty.
"""

from __future__ import annotations

import ast
import re

import pytest
from click.testing import CliRunner

from gpudoctor.cli import cli
from gpudoctor.exit_codes import BY_COMMAND, ExitCode
from tests.cli.support import REPO

E = ExitCode
# Where each command's exit codes are decided: (file, functions; None = the whole file).
# Every command also gets cli.main's OK / ERROR / USAGE / INTERRUPTED (gpudoctor/cli.py).
SOURCES: dict[str, tuple[tuple[str, tuple[str, ...] | None], ...]] = {
    "check": (
        ("gpudoctor/commands/check.py", None),
        ("gpudoctor/commands/check_fleet.py", None),
    ),
    "fix": (
        ("gpudoctor/commands/fix.py", None),
        ("gpudoctor/commands/fix_cluster.py", None),
        ("gpudoctor/pve/fixer.py", None),
        ("gpudoctor/fleet/fix.py", None),
    ),
    "weights ensure": (("gpudoctor/commands/weights.py", ("ensure", "_fail", "_run")),),
    "weights status": (("gpudoctor/commands/weights.py", ("status", "_fail", "_run")),),
    "weights mirror": (("gpudoctor/commands/weights.py", ("mirror", "_fail", "_run")),),
    "bench run": (("gpudoctor/commands/bench.py", ("run",)),),
    "bench report": (("gpudoctor/commands/bench_report.py", None),),
    "bench merge": (("gpudoctor/commands/bench_cluster.py", None),),
    "list": (("gpudoctor/commands/list.py", None),),
    "--version": (),
}
# (command, the --help's phrase for each code it lists): the number must precede the phrase.
HELP_PHRASES: dict[str, dict[ExitCode, str]] = {
    "": {
        E.OK: "healthy",
        E.ERROR: "gpudoctor error",
        E.USAGE: "usage error",
        E.FAILED: "at least one FAIL",
        E.INTERRUPTED: "interrupted",
    },
    "check": {
        E.OK: "healthy",
        E.FAILED: "at least one FAIL or ERROR",
        E.NOTHING_DONE: "nothing was checked",
        E.ERROR: "gpudoctor error",
        E.USAGE: "usage error",
    },
    "fix": {
        E.OK: "applied, or nothing to change",
        E.ERROR: "gpudoctor error",
        E.USAGE: "usage error",
        E.FAILED: "not applied, failed or rolled back",
        E.NOTHING_DONE: "changes pending, nothing written",
    },
    "weights status": {E.OK: "when complete", E.FAILED: "when missing", E.ERROR: "on error"},
    "list": {E.OK: "listed", E.ERROR: "gpudoctor error", E.USAGE: "usage"},
}
# A word the README's cell of (command, code) must hold: what the code means there.
README_MEANINGS: dict[tuple[str, ExitCode], str] = {
    ("check", E.FAILED): "FAIL",
    ("check", E.NOTHING_DONE): "nothing was checked",
    ("fix", E.FAILED): "not applied",
    ("fix", E.NOTHING_DONE): "changes pending",
    ("weights status", E.FAILED): "not complete",
    ("bench run", E.FAILED): "preflight",
}


def readme_table() -> dict[str, dict[int, str]]:
    """Return {command: {code: cell}} from the README's "Exit codes" table (non-empty cells);
    the command is the row's first backquoted word(s)."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    assert header[0] == "command", header
    codes = [int(c) for c in header[1:]]
    table: dict[str, dict[int, str]] = {}
    for row in rows[2:]:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        name = re.search(r"`([^`]+)`", cells[0])
        assert name, row
        table[name.group(1)] = {
            code: cell for code, cell in zip(codes, cells[1:], strict=True) if cell
        }
    return table


def used_members(path: str, functions: tuple[str, ...] | None) -> set[ExitCode]:
    """Return the ExitCode members that ``path`` (or only its ``functions``) names."""
    tree = ast.parse((REPO / path).read_text())
    nodes: list[ast.AST] = [tree]
    if functions is not None:
        nodes = [
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name in functions
        ]
        assert {n.name for n in nodes} == set(functions), (path, functions)  # type: ignore[attr-defined]
    found: set[ExitCode] = set()
    for node in nodes:
        for sub in ast.walk(node):
            if (
                isinstance(sub, ast.Attribute)
                and isinstance(sub.value, ast.Name)
                and sub.value.id == "ExitCode"
            ):
                found.add(ExitCode[sub.attr])
    return found


def help_text(command: str) -> str:
    """Return ``gpudoctor COMMAND --help``, its whitespace folded to single spaces."""
    result = CliRunner().invoke(cli, [*command.split(), "--help"], prog_name="gpudoctor")
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_every_code_has_one_name() -> None:
    assert [(m.name, int(m)) for m in ExitCode] == [
        ("OK", 0),
        ("ERROR", 1),
        ("USAGE", 2),
        ("FAILED", 3),
        ("NOTHING_DONE", 4),
        ("INTERRUPTED", 130),
    ]
    assert len(ExitCode.__members__) == len(ExitCode)  # no alias names
    assert str(ExitCode.NOTHING_DONE) == f"{ExitCode.NOTHING_DONE}" == "4"


def test_readme_table_is_the_enum_per_command() -> None:
    table = readme_table()
    assert set(table) == set(BY_COMMAND)
    for command, cells in table.items():
        assert set(cells) == {int(c) for c in BY_COMMAND[command]}, command
    for (command, code), word in README_MEANINGS.items():
        assert word in table[command][int(code)], (command, code, table[command])


def test_readme_header_lists_every_code() -> None:
    text = (REPO / "README.md").read_text().split("## Exit codes", 1)[1]
    header = text.strip().splitlines()[0]
    assert header == "| command | " + " | ".join(str(int(m)) for m in ExitCode) + " |"


@pytest.mark.parametrize("command", sorted(SOURCES))
def test_code_returns_only_what_its_row_documents(command: str) -> None:
    """The members a command's code names are in its row, and every member of its row is
    returned by its code or by cli.main (which gives every command 0, 1, 2 and 130)."""
    used: set[ExitCode] = set()
    for path, functions in SOURCES[command]:
        used |= used_members(path, functions)
    common = used_members("gpudoctor/cli.py", None)
    assert common == {E.OK, E.ERROR, E.USAGE, E.INTERRUPTED}
    assert used <= set(BY_COMMAND[command]), (command, used)
    assert set(BY_COMMAND[command]) <= used | common, command


@pytest.mark.parametrize("command", sorted(HELP_PHRASES))
def test_help_lists_the_codes_of_its_command(command: str) -> None:
    text = help_text(command)
    section = re.split(r"\bExit( codes)?:? ", text, maxsplit=1)[-1].split(" Options:", 1)[0]
    documented = (
        {int(m) for m in ExitCode} if command == "" else {int(m) for m in BY_COMMAND[command]}
    )
    listed = {int(n) for n in re.findall(r"(?<![\w./-])(\d{1,3})(?![\w.])", section)}
    assert listed <= documented, (command, listed)
    for code, phrase in HELP_PHRASES[command].items():
        assert re.search(rf"\b{int(code)}:? {re.escape(phrase)}", section), (command, code)
    if command == "":
        for sub in ("check", "fix"):
            assert f"{sub} {ExitCode.NOTHING_DONE}: " in section


def test_docs_use_the_same_numbers() -> None:
    fix_md = (REPO / "docs" / "fix.md").read_text()
    table = fix_md.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\|\s*([0-9]+)\s*\|\s*(.+?)\s*\|$", table, re.M))
    assert {int(c) for c in rows} == set(BY_COMMAND["fix"]) - {E.INTERRUPTED}
    assert rows[str(int(E.NOTHING_DONE))].startswith("changes pending")
    assert rows[str(int(E.FAILED))].startswith("not applied")
    cli_md = " ".join((REPO / "docs" / "cli.md").read_text().split())
    assert f"`check` exits {int(E.NOTHING_DONE)} when **nothing was checked**" in cli_md
    names = ", ".join(f"{int(m)} `{m.name}`" for m in ExitCode)
    assert f"`gpudoctor/exit_codes.py`: {names}." in cli_md


def _report(*statuses: str) -> list:
    from gpudoctor.model import CheckResult, Finding, Report, Status

    findings = tuple(Finding(f"c.{i}", Status(s), "host", "m") for i, s in enumerate(statuses))
    return [Report("local", (CheckResult("c", findings),))]


@pytest.mark.parametrize(
    ("statuses", "code"),
    [
        (("ERROR",), E.FAILED),  # only ERROR findings: the job ran and the answer is no
        (("FAIL",), E.FAILED),
        (("PASS", "WARN", "SKIP", "ERROR"), E.FAILED),
        (("SKIP", "FAIL"), E.FAILED),
        (("SKIP",), E.NOTHING_DONE),
        (("SKIP", "SKIP"), E.NOTHING_DONE),
        ((), E.NOTHING_DONE),  # no finding at all: nothing was checked
        (("PASS",), E.OK),
        (("WARN",), E.OK),  # warnings allowed
        (("SKIP", "PASS"), E.OK),
        (("SKIP", "WARN"), E.OK),
    ],
)
def test_check_exit_code_from_findings(statuses: tuple[str, ...], code: ExitCode) -> None:
    from gpudoctor.commands.check import exit_code

    assert exit_code(_report(*statuses)) == code
    # the findings of several targets count together
    assert exit_code([*_report("PASS"), *_report(*statuses)]) == (
        E.OK if code == E.NOTHING_DONE else code
    )
