"""Quirk tables: the shipped table, and a local crash quirk recorded and found again."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.bench.plan import load_plan, parse_plan
from gpudoctor.bench.plan.quirks import (
    find_quirk,
    load_quirks,
    load_table,
    record_crash,
    toml_string,
)

EXAMPLES = Path(__file__).parents[3] / "docs" / "examples"
SEED = (EXAMPLES / "qwen36-dflash-ddtree.toml").read_text()


def _ddtree(budget: int):
    plan = parse_plan(SEED.replace("[15, 16, 32, 64]", f"[{budget}]"))
    return next(c for c in plan.configs if c.name.startswith("ddtree"))


@pytest.mark.parametrize(("budget", "arch", "hit"), [(8, "sm_120", True), (12, "sm_120", True),
                                                    (16, "sm_120", False), (8, "sm_90", False)])  # fmt: skip
def test_shipped_ddtree_quirk(budget: int, arch: str, hit: bool, local_quirks: Path) -> None:
    quirk = find_quirk(load_quirks(local_quirks), arch, "sglang", "0.5.23", _ddtree(budget))
    assert (quirk is not None) == hit
    if hit:
        assert "SM120" in quirk.reason and quirk.source == "shipped"


def test_local_crash_quirk_round_trip(local_quirks: Path) -> None:
    plan = load_plan(EXAMPLES / "qwen36-dflash-ddtree.toml")
    crashed, other = plan.configs[1], plan.configs[2]
    record_crash(
        local_quirks, "sm_90", "sglang", "0.5.23", crashed, 'server exited with code -6 "abort"'
    )
    record_crash(local_quirks, "sm_90", "sglang", "0.5.23", other, "second")
    table = load_table(local_quirks, str(local_quirks))
    assert [q.id for q in table] == [f"crash-{crashed.key}", f"crash-{other.key}"]
    quirks = load_quirks(local_quirks)
    assert (
        find_quirk(quirks, "sm_90", "sglang", "0.5.23", crashed).reason
        == 'server exited with code -6 "abort"'
    )
    assert find_quirk(quirks, "sm_90", "sglang", "0.5.24", crashed) is None  # another version
    assert find_quirk(quirks, "sm_120", "sglang", "0.5.23", crashed) is None  # another GPU
    assert find_quirk(quirks, "sm_90", "sglang", "0.5.23", plan.configs[0]) is None


NASTY = '🚀 launch 𝔘𝔫𝔦 "quoted" back\\slash tab\tnew\nline nul\x00 esc\x1b del\x7f é'


def test_crash_quirk_with_non_bmp_and_control_text_round_trips(local_quirks: Path) -> None:
    """Attack (issue 22.8): a crashed config whose argument holds an emoji was written to the
    local quirks table as JSON's `\\ud83d\\ude80`, which is invalid TOML: every later bench on
    the machine failed to read the table. Non-BMP text, quotes, backslashes and control
    characters (a newline would even start a new TOML line) must come back exactly."""
    plan = parse_plan(
        "[model]\npath = '/m'\n[engine]\nname = 'sglang'\n"
        f"[[configs]]\nname = {toml_string('rocket 🚀')}\n"
        f"args = {{ {toml_string('chat-template')} = {toml_string(NASTY)}, mem-fraction-static = 0.5,"
        " disable-cuda-graph = true, cuda-graph-bs = [1, 2] }\n"
    )
    config = plan.configs[0]
    assert config.arg("chat-template") == NASTY  # the plan itself parsed it
    record_crash(local_quirks, "sm_90", "sglang", "0.5.23", config, f"died: {NASTY}")
    record_crash(local_quirks, "sm_90", "sglang", "0.5.23", config, "again 🚀")
    raw = local_quirks.read_bytes()
    assert b"\\ud83d" not in raw.lower() and "🚀".encode() in raw

    import tomllib

    data = tomllib.loads(raw.decode("utf-8"))  # valid TOML: every later bench can read it
    entry = data["quirk"][0]
    assert entry["args"] == {"chat-template": NASTY, "mem-fraction-static": 0.5,
                             "disable-cuda-graph": True, "cuda-graph-bs": [1, 2]}  # fmt: skip
    assert entry["reason"] == f"died: {NASTY}" and entry["config"] == "rocket 🚀@tp1"
    table = load_table(local_quirks, str(local_quirks))
    assert find_quirk(table, "sm_90", "sglang", "0.5.23", config).reason == f"died: {NASTY}"


@pytest.mark.parametrize(
    "text", ["", "plain", "🚀", "\ud83d", "\x00\x1f\x7f", '\\"\\', "\u2028\ufeff"]
)
def test_toml_string_is_read_back_by_tomllib(text: str) -> None:
    import tomllib

    got = tomllib.loads(f"v = {toml_string(text)}\n")["v"]
    assert got == ("\ufffd" if text == "\ud83d" else text)


def test_a_crash_quirk_never_stores_a_secret_argument(local_quirks: Path) -> None:
    """Issue 46.11: the table kept a configuration's args verbatim, ``api-key`` included.
    A secret-named argument is stored as ``<redacted>``, a token inside another argument is
    replaced, the rest (numbers, flags, lists, plain text) kept; the quirk still matches."""
    import tomllib

    key, token = "PlantedOpaqueApiKey0123456789", "hf_PlantedHuggingFaceToken0123456789"
    plan = parse_plan(
        "[model]\npath = '/m'\n[engine]\nname = 'sglang'\n[[configs]]\nname = 'c'\n"
        f"args = {{ api-key = '{key}', hf-token = 7, tokenizer-mode = 'auto', served-model-name = 'alice 10.0.0.5',"
        f" model-loader-extra-config = 'https://x.example/m?t={token}', mem-fraction-static = 0.5,"
        " cuda-graph-bs = [1, 2], disable-cuda-graph = true }\n"
    )
    config = plan.configs[0]
    record_crash(local_quirks, "sm_90", "sglang", "0.5.23", config, "died")
    raw = local_quirks.read_text()
    assert key not in raw and token not in raw
    (entry,) = tomllib.loads(raw)["quirk"]
    assert entry["args"] == {"api-key": "<redacted>", "hf-token": "<redacted>",
                             "tokenizer-mode": "auto", "served-model-name": "alice 10.0.0.5",  # no secret: kept
                             "model-loader-extra-config": "https://x.example/m?t=<secret-1>",
                             "mem-fraction-static": 0.5, "cuda-graph-bs": [1, 2],
                             "disable-cuda-graph": True}  # fmt: skip
    assert find_quirk(load_table(local_quirks, "t"), "sm_90", "sglang", "0.5.23", config)
