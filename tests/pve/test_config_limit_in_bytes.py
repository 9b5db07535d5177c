"""pmxcfs refuses a file over 1 MiB counted in BYTES; a config with non-ASCII text (a
description in another script, an emoji) is refused by its UTF-8 size, not by how many
characters it has. The configs are real files read back through a real LocalHost."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.hosts.local import LocalHost
from gpudoctor.pve.config import PMXCFS_MAX_BYTES, ConfigError, parse


def _written(tmp_path: Path, text: str) -> bytes:
    path = tmp_path / "200.conf"
    path.write_text(text, encoding="utf-8")
    return LocalHost().read_bytes(str(path), 4 * PMXCFS_MAX_BYTES)


def test_a_config_of_fewer_characters_but_more_bytes_than_1_mib_is_refused(tmp_path) -> None:
    line = "#" + "é" * 511 + "\n"  # 513 characters, 1024 bytes in UTF-8
    text = "arch: amd64\n" + line * 1024
    assert len(text) < PMXCFS_MAX_BYTES < len(text.encode())
    with pytest.raises(ConfigError, match=f"{len(text.encode())} bytes"):
        parse(_written(tmp_path, text))
    with pytest.raises(ConfigError, match="1 MiB"):
        parse(text)  # as text too: the limit is the UTF-8 size


def test_a_non_ascii_config_of_exactly_1_mib_is_kept(tmp_path) -> None:
    line = "#" + "€" * 340 + "xx\n"  # 1 + 1020 + 2 + 1 = 1024 bytes, 344 characters
    text = line * 1024
    assert len(text.encode()) == PMXCFS_MAX_BYTES
    assert parse(_written(tmp_path, text)).text == text
