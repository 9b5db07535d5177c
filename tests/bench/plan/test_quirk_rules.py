"""A quirk's matching rules, the table's errors and defaults, and the exact block a crash
appends (gpudoctor/bench/plan/quirks.py, value by value)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.bench.plan import ServerConfig
from gpudoctor.bench.plan.quirks import (
    SHIPPED,
    Quirk,
    QuirksError,
    default_local_path,
    detect_arch,
    find_quirk,
    load_quirks,
    load_table,
    record_crash,
)

CONFIG = ServerConfig(
    name="ddtree-b8",
    tp=2,
    args=(("--speculative-algorithm", "DDTREE"), ("--budget", 8), ("--cuda-graph", True)),
    env=(),
    concurrencies=(1, 4),
    key="abc123def456",
)


def quirk(**kw) -> Quirk:
    base = dict(id="q", arch="*", engine="*", engine_version="*", match=(), reason="r")
    base.update(kw)
    return Quirk(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("q", "hit"),
    [
        (quirk(), True),
        (quirk(arch="sm_120"), True),
        (quirk(arch="sm_90"), False),
        (quirk(engine="sglang"), True),
        (quirk(engine="vllm"), False),
        (quirk(engine_version="0.5.*"), True),
        (quirk(engine_version="0.6.*"), False),
        (quirk(engine_version="0.5.2"), False),  # the whole version, not a prefix
        (quirk(match=(("tp", 2),)), True),
        (quirk(match=(("tp", 1),)), False),
        (quirk(match=(("config_key", "abc123def456"),)), True),
        (quirk(match=(("config_key", "abc"),)), False),
        (quirk(match=(("--budget", (4, 8, 12)),)), True),  # any of them
        (quirk(match=(("--budget", (16, 32)),)), False),
        (quirk(match=(("--budget", "8"),)), True),  # compared as text
        (quirk(match=(("--cuda-graph", True),)), True),
        (quirk(match=(("--budget", 8), ("tp", 1))), False),  # all must hold
        (quirk(match=(("--budget", 8), ("tp", 2))), True),
        (quirk(match=(("--not-set", "x"),)), False),  # an unset argument never matches
    ],
)
def test_what_a_quirk_matches(q: Quirk, hit: bool) -> None:
    assert q.matches("sm_120", "sglang", "0.5.23", CONFIG) is hit


def test_an_unknown_engine_version_only_matches_a_star() -> None:
    assert quirk().matches("cpu", "sglang", None, CONFIG)
    assert not quirk(engine_version="0.*").matches("cpu", "sglang", None, CONFIG)


def test_find_quirk_returns_the_first_match() -> None:
    first, second = quirk(id="a", arch="sm_120"), quirk(id="b")
    assert (
        find_quirk([quirk(id="x", arch="cpu"), first, second], "sm_120", "e", "1", CONFIG) is first
    )
    assert find_quirk([quirk(id="x", arch="cpu")], "sm_120", "e", "1", CONFIG) is None


def test_table_defaults_lists_and_errors(tmp_path: Path) -> None:
    table = tmp_path / "q.toml"
    table.write_text(
        '[[quirk]]\nid = "one"\nreason = "boom"\n\n'
        '[[quirk]]\nid = 2\narch = "sm_90"\nengine = "vllm"\nengine_version = "0.3*"\n'
        'reason = "x"\nmatch = { tp = 4, "--budget" = [8, 12] }\n'
    )
    assert load_table(table, "mine") == [
        Quirk("one", "*", "*", "*", (), "boom", "mine"),
        Quirk("2", "sm_90", "vllm", "0.3*", (("tp", 4), ("--budget", (8, 12))), "x", "mine"),
    ]
    assert load_table(tmp_path / "missing.toml", "x") == []
    table.write_text('[[quirk]]\nid = "one"\n')
    with pytest.raises(QuirksError) as info:
        load_table(table, "mine")
    assert str(info.value) == f"{table}: quirk[0] lacks 'reason' (needs id and reason)"
    table.write_text("not = [toml")
    with pytest.raises(QuirksError, match=rf"^{table}: cannot read quirks table: "):
        load_table(table, "mine")
    table.write_bytes(b"\xff\xfe")
    with pytest.raises(QuirksError, match="cannot read quirks table"):
        load_table(table, "mine")


def test_shipped_quirks_come_first_then_the_local_ones(tmp_path: Path) -> None:
    local = tmp_path / "local.toml"
    local.write_text('[[quirk]]\nid = "mine"\nreason = "r"\n')
    quirks = load_quirks(local)
    shipped = load_table(SHIPPED, "shipped")
    assert shipped and quirks[: len(shipped)] == shipped
    assert [q.id for q in quirks[len(shipped) :]] == ["mine"]
    assert quirks[-1].source == str(local)


def test_the_local_table_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUDOCTOR_BENCH_QUIRKS", str(tmp_path / "q.toml"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert default_local_path() == tmp_path / "q.toml"
    monkeypatch.setenv("GPUDOCTOR_BENCH_QUIRKS", "")
    assert default_local_path() == tmp_path / "xdg" / "gpudoctor" / "bench-quirks.toml"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_local_path() == tmp_path / "home" / ".config" / "gpudoctor" / "bench-quirks.toml"
    (tmp_path / "home").mkdir()
    assert load_quirks() == load_table(SHIPPED, "shipped")  # no local table yet


def test_a_crash_appends_a_readable_block_that_loads_back(tmp_path: Path) -> None:
    table = tmp_path / "new" / "dir" / "quirks.toml"
    made = record_crash(table, "sm_120", "sglang", None, CONFIG, 'exit -6 "abort"')
    assert made == Quirk(
        "crash-abc123def456", "sm_120", "sglang", "*", (("config_key", "abc123def456"),),
        'exit -6 "abort"', str(table),
    )  # fmt: skip
    text = table.read_text()
    assert text.startswith("\n# added ") and " UTC: ddtree-b8@tp2 crashed its server\n" in text
    assert text.split(" crashed its server\n", 1)[1] == (
        "[[quirk]]\n"
        'id = "crash-abc123def456"\n'
        'arch = "sm_120"\n'
        'engine = "sglang"\n'
        'engine_version = "*"\n'
        'match = { config_key = "abc123def456" }\n'
        'config = "ddtree-b8@tp2"\n'
        'args = { "--speculative-algorithm" = "DDTREE", "--budget" = 8, "--cuda-graph" = true }\n'
        'reason = "exit -6 \\"abort\\""\n'
    )
    assert load_table(table, str(table)) == [made]
    other = ServerConfig("b", 1, (("--x", False), ("--l", (1, 2.5))), (), (1,), "k2")
    record_crash(table, "cpu", "vllm", "0.3.1", other, "r")
    assert 'args = { "--x" = false, "--l" = [1, 2.5] }\n' in table.read_text()
    assert [q.id for q in load_table(table, "t")] == ["crash-abc123def456", "crash-k2"]
    assert load_table(table, "t")[1].engine_version == "0.3.1"


def test_detect_arch_without_an_nvidia_driver_is_cpu() -> None:
    import shutil

    if shutil.which("nvidia-smi"):
        pytest.skip("an NVIDIA driver is present")
    assert detect_arch() == "cpu"


def test_a_table_without_quirks_is_empty(tmp_path: Path) -> None:
    table = tmp_path / "q.toml"
    table.write_text("# nothing crashed yet\n")
    assert load_table(table, "mine") == []
