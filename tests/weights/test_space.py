"""Space precheck: the rule (pure) and the measurement of a real tmpfs mount."""

from __future__ import annotations

from pathlib import Path

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


def test_exactly_the_free_space_fits() -> None:
    check_fits(5 * GB, SpaceInfo("/x", "/", "ext4", 5 * GB, 10 * GB))
    check_fits(5 * GB, SpaceInfo("/s", "/s", "tmpfs", 5 * GB, 10 * GB, ram_available_bytes=5 * GB))
    with pytest.raises(SpaceError):
        check_fits(5 * GB + 1, SpaceInfo("/x", "/", "ext4", 5 * GB, 10 * GB))
    with pytest.raises(SpaceError, match=r"only 5\.0 GB RAM"):
        check_fits(5 * GB + 1, SpaceInfo("/s", "/s", "tmpfs", 9 * GB, 9 * GB, 5 * GB))


def test_the_refusal_is_one_line_with_the_numbers() -> None:
    info = SpaceInfo("/m", "/models", "xfs", 1500, 2 * GB)
    with pytest.raises(SpaceError) as err:
        check_fits(12_345, info, what="acme/x")
    assert str(err.value) == (
        "not enough space for acme/x in /models (xfs, size 2.0 GB):"
        " need 12.3 kB (12345 bytes), only 1.5 kB free"
    )


def test_short_of_both_disk_and_ram_names_the_disk() -> None:
    info = SpaceInfo("/s", "/s", "tmpfs", 1 * GB, 2 * GB, ram_available_bytes=1 * GB)
    with pytest.raises(SpaceError, match=r"only 1\.0 GB free$"):
        check_fits(3 * GB, info)


def test_only_memory_filesystems_are_in_memory() -> None:
    assert SpaceInfo("/", "/", "ramfs", 1, 1).in_memory
    assert not SpaceInfo("/", "/", "ext4", 1, 1).in_memory


def test_nearest_existing_dir_climbs_to_what_exists(tmp_path) -> None:
    from gpudoctor.weights.space import nearest_existing_dir

    assert nearest_existing_dir(tmp_path / "a" / "b") == tmp_path
    assert nearest_existing_dir(tmp_path) == tmp_path
    (tmp_path / "file").write_text("x")
    assert nearest_existing_dir(tmp_path / "file" / "sub") == tmp_path
    assert nearest_existing_dir(Path("/no-such-dir-gpudoctor/x")) == Path("/")


def test_mount_of_skips_short_lines_and_takes_the_last_of_stacked_mounts() -> None:
    mountinfo = (
        "garbage\n"
        "1 2 3\n"
        "22 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        "40 22 0:30 / /models rw - xfs /dev/vdb rw\n"
        "41 40 0:31 / /models rw - tmpfs tmpfs rw\n"  # mounted over the first: it is seen
        "42 22 0:32 / /broken rw -\n"
    )
    assert _mount_of(Path("/models/q"), mountinfo) == ("/models", "tmpfs")
    assert _mount_of(Path("/models"), mountinfo) == ("/models", "tmpfs")
    assert _mount_of(Path("/broken/x"), mountinfo) == ("/", "ext4")
    assert _mount_of(Path("/x"), "") == ("/", "unknown")


def test_measure_a_disk_directory(tmp_path) -> None:
    import os

    info = measure_space(tmp_path / "new")
    st = os.statvfs(tmp_path)
    assert info.path == str(tmp_path.resolve())
    assert info.ram_available_bytes is None and not info.in_memory
    assert info.size_bytes == st.f_blocks * st.f_frsize
    assert info.free_bytes > 0 and info.free_bytes <= info.size_bytes


def test_same_filesystem(tmp_path, tmpfs) -> None:
    from gpudoctor.weights.space import same_filesystem

    assert same_filesystem(tmp_path / "a" / "new", tmp_path)
    assert not same_filesystem(tmp_path, tmpfs("1m") / "new")


def test_exactly_the_free_disk_but_too_little_ram_names_the_ram() -> None:
    info = SpaceInfo("/s", "/s", "tmpfs", 5 * GB, 9 * GB, ram_available_bytes=4 * GB)
    with pytest.raises(SpaceError, match=r"only 4\.0 GB RAM available for tmpfs pages$"):
        check_fits(5 * GB, info)


def test_the_refusal_names_the_model_by_default_and_zero_ram() -> None:
    info = SpaceInfo("/s", "/s", "tmpfs", 9 * GB, 9 * GB, ram_available_bytes=0)
    with pytest.raises(SpaceError) as err:
        check_fits(1, info)
    assert str(err.value).startswith("not enough space for the model in /s (tmpfs")
    assert str(err.value).endswith("only 0 B RAM available for tmpfs pages")


def test_mount_of_a_mount_point_ending_in_a_capital_letter() -> None:
    mountinfo = "22 1 254:0 / / rw - ext4 /dev/vda rw\n40 22 0:30 / /mnt/BOX rw - xfs /dev/vdb rw\n"
    assert _mount_of(Path("/mnt/BOX/models"), mountinfo) == ("/mnt/BOX", "xfs")
