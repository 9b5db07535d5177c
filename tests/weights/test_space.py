"""Space precheck: the rule (pure) and the measurement of a real tmpfs mount."""

from __future__ import annotations

import pytest

from gpudoctor.weights.errors import SpaceError
from gpudoctor.weights.space import SpaceInfo, _mount_of, bytes_on_disk, check_fits, measure_space

GB = 1000**3


def test_bytes_on_disk_rounds_each_file_up_to_a_block() -> None:
    assert bytes_on_disk([0, 1, 4096, 4097]) == 0 + 4096 + 4096 + 8192


def test_fits_on_disk() -> None:
    check_fits(10 * GB, SpaceInfo("/x", "/", "ext4", 20 * GB, 100 * GB))


def test_too_big_for_the_filesystem() -> None:
    info = SpaceInfo("/dev/shm", "/dev/shm", "tmpfs", 1 * GB, 2 * GB, ram_available_bytes=50 * GB)
    with pytest.raises(SpaceError) as err:
        check_fits(52 * GB, info)
    text = str(err.value)
    assert "need 52.0 GB" in text and "only 1.0 GB free" in text and "/dev/shm (tmpfs" in text


def test_tmpfs_bigger_than_ram_is_refused() -> None:
    info = SpaceInfo(
        "/dev/shm", "/dev/shm", "tmpfs", 100 * GB, 100 * GB, ram_available_bytes=8 * GB
    )
    with pytest.raises(SpaceError, match=r"only 8\.0 GB RAM available"):
        check_fits(52 * GB, info)


def test_mount_of_picks_the_longest_mount_point() -> None:
    mountinfo = (
        "22 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        "30 22 0:25 / /dev/shm rw,nosuid - tmpfs tmpfs rw\n"
        "31 22 0:26 / /mnt/my\\040models rw - tmpfs tmpfs rw,size=1024k\n"
    )
    from pathlib import Path

    assert _mount_of(Path("/dev/shm/qwen"), mountinfo) == ("/dev/shm", "tmpfs")
    assert _mount_of(Path("/dev/shmx"), mountinfo) == ("/", "ext4")
    assert _mount_of(Path("/mnt/my models/a"), mountinfo) == ("/mnt/my models", "tmpfs")


def test_measure_a_real_tmpfs(tmpfs) -> None:
    shm = tmpfs("2m")
    info = measure_space(shm / "not" / "yet" / "created")
    assert (info.mount_point, info.fs_type, info.in_memory) == (str(shm), "tmpfs", True)
    assert info.size_bytes == 2 * 1024 * 1024 and info.free_bytes == info.size_bytes
    assert info.ram_available_bytes is not None and info.ram_available_bytes > 0
