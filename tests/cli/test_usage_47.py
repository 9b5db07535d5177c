"""Usage a new user gets wrong (issue 47, smaller ones and Help), through the real CLI:
``--debug`` after the subcommand, a command typo, a parser's usage error."""

from __future__ import annotations

from tests.cli.support import gpudoctor, last_line


def test_debug_after_the_subcommand_is_the_root_option_not_a_typo_of_deep() -> None:
    """`gpudoctor check --debug` said "No such option '--debug'. Did you mean '--deep'?"."""
    done = gpudoctor("check", "--debug", "--lxcpath", "x")
    assert done.returncode == 2, done.stderr
    assert "No such option" not in done.stderr and "--deep" not in done.stderr
    assert last_line(done.stderr) == (
        "gpudoctor: error: --lxcpath is for plain LXC containers: add --flavor lxc;"
        " see 'gpudoctor check --help'"
    )
    listed = gpudoctor("list", "--debug", "--json")
    assert listed.returncode == 0, listed.stderr
    assert '"schema": "gpudoctor.list/1"' in listed.stdout


def test_a_command_typo_is_told_the_nearest_command() -> None:
    """A command typo got no "did you mean" (`gpudoctor chek`)."""
    done = gpudoctor("chek")
    assert done.returncode == 2
    assert last_line(done.stderr) == (
        "gpudoctor: error: No such command 'chek'. Did you mean 'check'?; see 'gpudoctor --help'"
    )
    far = gpudoctor("xyzzy")
    assert (
        last_line(far.stderr) == "gpudoctor: error: No such command 'xyzzy'; see 'gpudoctor --help'"
    )


def test_an_option_missing_its_value_points_to_the_subcommands_help() -> None:
    """`check --ct` and `bench PLAN --out` pointed to the top-level help."""
    for args, command in ((["check", "--ct"], "gpudoctor check"),
                          (["bench", "plan.toml", "--out"], "gpudoctor bench"),
                          (["bench", "report", "--out"], "gpudoctor bench report")):  # fmt: skip
        done = gpudoctor(*args)
        assert done.returncode == 2, done.stderr
        assert last_line(done.stderr).endswith(f"requires an argument; see '{command} --help'")


def test_fix_help_keeps_examples_options_and_exit_codes_and_points_to_the_docs() -> None:
    """`fix --help` was 159 lines: a 45-line prose block before the options. The prose is
    docs/fix.md's; the help keeps its examples, options and exit codes."""
    done = gpudoctor("fix", "--help", env={"COLUMNS": "80"})
    assert done.returncode == 0
    text = done.stdout
    for kept in ("Examples:", "gpudoctor fix --host root@pve1 --ct 200 --yes", "Exit codes:",
                 "Options:", "--follow-driver", "--host-prep", "nothing to change"):  # fmt: skip
        assert kept in text, kept
    prose = text.split("--dry-run\n", 1)[1].split("Exit codes:", 1)[0]
    assert len([ln for ln in prose.splitlines() if ln.strip()]) <= 7, prose
    assert "docs/fix.md" in prose
    assert len(text.splitlines()) < 145  # was 159


def test_bench_help_names_every_engine() -> None:
    """`bench --help` omitted the `command` engine."""
    from gpudoctor.bench.engines import ENGINES

    text = " ".join(gpudoctor("bench", "--help").stdout.split())
    for name in ENGINES:
        assert name in text.split("A plan (TOML) names a model, an engine (", 1)[1].split(")")[0]


def test_weights_ensure_help_speaks_of_no_target_argument() -> None:
    """`weights ensure --help` spoke of a TARGET argument that does not exist (it is --to)."""
    done = gpudoctor("weights", "ensure", "--help")
    assert done.returncode == 0
    assert "Usage: gpudoctor weights ensure [OPTIONS] REPO_ID" in done.stdout
    assert "TARGET" not in done.stdout
