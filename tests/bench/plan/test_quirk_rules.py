"""A quirk's matching rules, the table's errors and defaults, and the exact block a crash
appends (gpudoctor/bench/plan/quirks.py, value by value)."""

from __future__ import annotations

import calendar
import fcntl
import locale
import math
import os
import re
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib

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
    toml_string,
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
    assert not quirk(engine_version="?*").matches("cpu", "sglang", None, CONFIG)  # any known one


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


@pytest.mark.parametrize(
    ("text", "written"),
    [
        ("\ud800", '"\ufffd"'),
        ("\udfff", '"\ufffd"'),
        ("\ud7ff", '"\ud7ff"'),
        ("\ue000", '"\ue000"'),
    ],
)
def test_only_lone_surrogates_become_the_replacement_character(text: str, written: str) -> None:
    """U+D800-U+DFFF cannot be written as UTF-8; their neighbours are ordinary characters."""
    assert toml_string(text) == written


def test_non_finite_float_arguments_are_written_as_toml_reads_them(tmp_path: Path) -> None:
    table = tmp_path / "q.toml"
    odd = ServerConfig(
        "f", 1, (("--a", math.inf), ("--b", -math.inf), ("--c", math.nan), ("--d", 0.5)), (), (1,), "k"
    )  # fmt: skip
    record_crash(table, "cpu", "vllm", "1", odd, "r")
    text = table.read_text()
    assert 'args = { "--a" = inf, "--b" = -inf, "--c" = nan, "--d" = 0.5 }\n' in text
    args = tomllib.loads(text)["quirk"][0]["args"]
    assert args["--a"] == math.inf and args["--b"] == -math.inf and math.isnan(args["--c"])


def test_a_label_with_control_characters_stays_one_comment_line(tmp_path: Path) -> None:
    table = tmp_path / "q.toml"
    odd = ServerConfig("a\nb\x1bc\u2028d", 1, (), (), (1,), "k")
    record_crash(table, "cpu", "vllm", "1", odd, "r")
    lines = table.read_text().split("\n")
    assert lines[1].endswith(": a?b?c?d@tp1 crashed its server") and lines[2] == "[[quirk]]"
    assert tomllib.loads(table.read_text())["quirk"][0]["config"] == "a\nb\x1bc\u2028d@tp1"


@pytest.fixture
def far_from_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process's local time zone nine hours ahead of UTC (a POSIX TZ: no tzdata needed)."""
    monkeypatch.setenv("TZ", "XST-9")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_a_crash_is_stamped_in_utc_whatever_the_local_zone(tmp_path: Path, far_from_utc) -> None:
    table = tmp_path / "q.toml"
    before = int(time.time())
    record_crash(table, "cpu", "vllm", "1", CONFIG, "r")
    after = time.time()
    found = re.match(r"\n# added (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC: ", table.read_text())
    assert found, table.read_text()
    stamped = calendar.timegm(time.strptime(found.group(1), "%Y-%m-%d %H:%M:%S"))
    assert before <= stamped <= after  # UTC, not the local time 9 hours ahead


def _lock_waiters(path: Path) -> list[str]:
    """The flock requests blocked on ``path`` (``->`` lines of /proc/locks)."""
    inode = f":{os.stat(path).st_ino} "
    return [ln for ln in Path("/proc/locks").read_text().splitlines() if "->" in ln and inode in ln]


def test_a_crash_waits_for_another_writers_lock_on_the_table(tmp_path: Path) -> None:
    """Two benches recording crashes at once never interleave their blocks: the append
    waits for the exclusive flock another writer holds on the table."""
    table = tmp_path / "q.toml"
    table.write_text("")
    holder = os.open(table, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    worker = threading.Thread(
        target=record_crash, args=(table, "cpu", "vllm", "1", CONFIG, "r"), daemon=True
    )
    try:
        worker.start()
        while worker.is_alive() and not _lock_waiters(table):
            time.sleep(0.005)
        assert _lock_waiters(table), "the crash was appended without waiting for the lock"
        assert table.read_text() == ""
    finally:
        fcntl.flock(holder, fcntl.LOCK_UN)
        os.close(holder)
        worker.join()
    assert [q.id for q in load_table(table, "t")] == ["crash-abc123def456"]


def test_the_table_may_live_in_a_symlinked_directory(tmp_path: Path) -> None:
    """~/.config/gpudoctor may be a link into a dotfiles checkout: the table is written there."""
    tmp_path.chmod(0o755)
    (tmp_path / "dotfiles").mkdir()
    (tmp_path / "config").symlink_to(tmp_path / "dotfiles")
    record_crash(tmp_path / "config" / "q.toml", "cpu", "vllm", "1", CONFIG, "r")
    assert [q.id for q in load_table(tmp_path / "dotfiles" / "q.toml", "t")] == [
        "crash-abc123def456"
    ]


def test_a_table_in_a_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(QuirksError) as info:
        record_crash(shared / "q.toml", "cpu", "vllm", "1", CONFIG, "r")
    assert str(info.value) == (
        f"cannot add to the local quirks table: {shared} (above path) is writable by others"
        f" and not sticky (mode 0777); choose another path or chmod o-w,+t {shared}"
    )
    assert not (shared / "q.toml").exists()


def test_a_table_is_read_as_utf8_whatever_the_locale(tmp_path: Path) -> None:
    table = tmp_path / "q.toml"
    table.write_text('[[quirk]]\nid = "é"\nreason = "🚀 crashed"\n', encoding="utf-8")
    previous = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")  # ASCII as the locale's encoding
    try:
        loaded = load_table(table, "t")
    finally:
        locale.setlocale(locale.LC_CTYPE, previous)
    assert [(q.id, q.reason) for q in loaded] == [("é", "🚀 crashed")]


class FakeNvml(types.ModuleType):
    """Stands in for ``pynvml`` (nvidia-ml-py) on a host whose GPU ``i`` has the CUDA
    compute capability ``capabilities[i]``; a bad index raises as NVML does."""

    def __init__(self, capabilities: list[tuple[int, int]], driver: bool = True) -> None:
        super().__init__("pynvml")
        self.capabilities, self.driver, self.calls = capabilities, driver, []

    def nvmlInit(self) -> None:
        if not self.driver:
            raise RuntimeError("NVML Shared Library Not Found")
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.capabilities)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> tuple[str, int]:
        if not isinstance(index, int) or not 0 <= index < len(self.capabilities):
            raise RuntimeError("Invalid Argument")
        return ("gpu", index)

    def nvmlDeviceGetCudaComputeCapability(self, handle: tuple[str, int]) -> tuple[int, int]:
        return self.capabilities[handle[1]]


@pytest.mark.parametrize(
    ("capabilities", "driver", "arch"),
    [([], True, "cpu"), ([(12, 0)], True, "sm_120"), ([(9, 0), (8, 6)], True, "sm_90"),
     ([(9, 0)], False, "cpu")],
)  # fmt: skip
def test_detect_arch_is_gpu_0s_compute_capability(
    monkeypatch: pytest.MonkeyPatch, capabilities: list[tuple[int, int]], driver: bool, arch: str
) -> None:
    nvml = FakeNvml(capabilities, driver)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert detect_arch() == arch
    assert nvml.calls == (["init", "shutdown"] if driver else [])  # NVML always shut down
