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
