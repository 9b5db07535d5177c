"""The /proc facts every node check reads, on recorded real files
(tests/data/recorded/proc_devices/SOURCES.md) and this machine's own /proc: which major
each NVIDIA family has now, which node paths are NVIDIA's, the loaded driver's version,
the mounts, the uid map, and what each CUDA/NVML return code is explained as."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.facts import cuda_errors, idmap, nodes, procfs
from gpudoctor.facts.procfs import DriverVersion, Mount

PROC = Path(__file__).parent.parent / "data" / "recorded" / "proc_devices"
H200 = "h200-lab_580.159.04_proc-devices.txt"
OLD = "nvidia-container-toolkit-115_535.104.05_proc-devices.txt"


def proc_devices(name: str) -> procfs.ProcDevices:
    return procfs.parse_proc_devices((PROC / name).read_text())


def test_proc_devices_sections() -> None:
    h200 = proc_devices(H200)
    assert h200.char[:3] == ((1, "mem"), (4, "/dev/vc/0"), (4, "tty"))
    assert h200.char[-1] == (254, "ndctl") and len(h200.char) == 34
    assert h200.block == ((7, "loop"), (253, "zram"), (254, "virtblk"), (259, "blkext"))
    assert h200.char_names(195) == ["nvidia", "nvidiactl"] and h200.char_names(99) == []
    assert h200.char_major("nvidia-frontend", "nvidiactl") == 195
    assert h200.char_major("nvidia-frontend") is None
    # zram is a block major: never taken for a char name
    assert procfs.parse_proc_devices("Block devices:\n253 zram\n").char == ()
    garbled = procfs.parse_proc_devices("junk\n195 nvidia\nCharacter devices:\nx y\n 10  misc \n")
    assert garbled.char == ((10, "misc"),)


@pytest.mark.parametrize(
    ("devices", "majors", "name195"),
    [(H200, {"nvidia": 195, "nvidia-uvm": 238, "nvidia-caps": 241,
             "nvidia-caps-imex-channels": 242, "nvidia-nvswitch": 239}, "nvidia/nvidiactl"),
     (OLD, {"nvidia": 195, "nvidia-uvm": 510, "nvidia-caps": 236, "nvidia-nvswitch": 234}, "nvidia-frontend")],
)  # fmt: skip
def test_each_familys_major_now(devices: str, majors: dict[str, int], name195: str) -> None:
    """580 registers 195 as nvidia + nvidiactl, 535 as nvidia-frontend; uvm's is dynamic."""
    devices = proc_devices(devices)
    assert nodes.nvidia_majors(devices) == majors
    assert nodes.driver_name_for_major(devices, 195) == name195
    assert nodes.driver_name_for_major(devices, 504) == "major 504 (not in /proc/devices)"


@pytest.mark.parametrize(
    ("path", "family"),
    [("/dev/nvidia0", "nvidia"), ("/dev/nvidia15", "nvidia"), ("/dev/nvidiactl", "nvidia"),
     ("/dev/nvidia-modeset", "nvidia"), ("/dev/nvidia-uvm", "nvidia-uvm"),
     ("/dev/nvidia-uvm-tools", "nvidia-uvm"), ("/dev/nvidia-caps/nvidia-cap1", "nvidia-caps"),
     ("/dev/nvidia-caps-imex-channels/channel0", "nvidia-caps-imex-channels"),
     ("/dev/nvidia-nvswitch3", "nvidia-nvswitch"), ("/dev/nvidia-nvlink", None),
     ("/dev/nvidia-caps", None), ("/dev/nvidia-cap1", None), ("/dev/xnvidia0", None),
     ("/dev/nvidia0x", None), ("/dev/nvidia-caps/channel0", None), ("/dev/shm/nvidia0", None)],
)  # fmt: skip
def test_which_paths_are_nvidia_nodes(path: str, family: str | None) -> None:
    got = nodes.family_of(path)
    assert (got.driver if got else None) == family


@pytest.mark.parametrize(
    ("listing", "found"),
    [({"/dev": ["null", "nvidia-caps", "nvidia-uvm", "nvidia0", "nvidiactl", "shm"],
       "/dev/nvidia-caps": ["nvidia-cap1", "nvidia-cap2"]},
      ["/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl",
       "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"]),
     # no /dev/nvidia-caps (no MIG), but IMEX channels: they are still found
     ({"/dev": ["nvidia0", "nvidiactl"], "/dev/nvidia-caps-imex-channels": ["channel0"]},
      ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-caps-imex-channels/channel0"])],
)  # fmt: skip
def test_discovery_lists_the_nvidia_nodes_of_each_directory(
    listing: dict[str, list[str]], found: list[str]
) -> None:
    def list_dir(path: str) -> list[str]:
        if path not in listing:
            raise FileNotFoundError(2, "No such file or directory", path)
        return listing[path]

    assert nodes.discover_nvidia_nodes(list_dir) == found


def test_the_node_families() -> None:
    caps = [f for f in nodes.NVIDIA_FAMILIES if f.is_dir]
    assert [(f.driver, f.directory) for f in caps] == [
        ("nvidia-caps", "/dev/nvidia-caps"),
        ("nvidia-caps-imex-channels", "/dev/nvidia-caps-imex-channels"),
    ]
    required = {f.driver: (f.required, f.at_least_one) for f in nodes.NVIDIA_FAMILIES}
    assert required["nvidia"] == (("nvidiactl",), r"nvidia[0-9]+")
    assert required["nvidia-uvm"] == (("nvidia-uvm",), "")


@pytest.mark.parametrize(
    ("kind", "words"),
    [("char", "a character device"), ("block", "a block device"), ("dir", "a directory"),
     ("file", "a regular file"), ("link", "a symbolic link"), ("fifo", "a FIFO"),
     ("socket", "a socket"), ("door", "a file of unknown type (door)")],
)  # fmt: skip
def test_a_node_kind_in_words(kind: str, words: str) -> None:
    assert nodes.a_kind(kind) == words


@pytest.mark.parametrize(
    ("text", "expected"),
    [((PROC / "h200-lab_580.159.04_proc-driver-nvidia-version.txt").read_text(),
      DriverVersion("580.159.04", "open",
                    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)")),
     ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n",
      DriverVersion("535.104.05", "proprietary",
                    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023")),
     ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  390.157",
      DriverVersion("390.157", "proprietary", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  390.157")),
     ("GCC version:  gcc version 12.2.0\n", None), ("NVRM version: unknown\n", None)],
)  # fmt: skip
def test_the_loaded_drivers_version(text: str, expected: DriverVersion | None) -> None:
    assert procfs.parse_driver_version(text) == expected


MOUNTS = (
    "/dev/mapper/pve-vm--200--disk--0 / ext4 rw,relatime 0 0\n"
    "tmpfs /dev tmpfs rw,nosuid,size=492k,mode=755,uid=100000,gid=100000 0 0\n"
    "udev /dev/nvidia0 devtmpfs rw,nosuid,relatime,size=65536k,mode=755 0 0\n"
    "tmpfs /dev/shm tmpfs rw,nosuid,nodev,size=65536000k,uid=100000 0 0\n"
    "/dev/sdb1 /mnt/model\\040store ext4 rw 0 0\n"
    "/dev/nvme0n1p1 /srv/gpuX ext4 rw 0 0\n"
    "/dev/sdc1 /mnt/a\\040 ext4 rw 0 0\n"
    "short line\n"
)


def test_mounts_and_the_mount_holding_a_path() -> None:
    mounts = procfs.parse_mounts(MOUNTS)
    assert [m.target for m in mounts] == [
        "/",
        "/dev",
        "/dev/nvidia0",
        "/dev/shm",
        "/mnt/model store",
        "/srv/gpuX",
        "/mnt/a ",
    ]
    assert mounts[3] == Mount("tmpfs", "/dev/shm", "tmpfs",
                              ("rw", "nosuid", "nodev", "size=65536000k", "uid=100000"))  # fmt: skip
    assert mounts[3].option("size") == "65536000k" and mounts[3].option("mode") is None
    assert mounts[1].option("uid") == "100000"
    held = {p: procfs.mount_of(mounts, p).target for p in
            ("/dev/shm", "/dev/shm/x", "/dev/shmem", "/dev/nvidia0", "/dev/nvidia-uvm",
             "/mnt/model store/llama", "/etc/hosts", "/srv/gpuX/models", "/mnt/a/x")}  # fmt: skip
    assert held == {"/dev/shm": "/dev/shm", "/dev/shm/x": "/dev/shm", "/dev/shmem": "/dev",
                    "/dev/nvidia0": "/dev/nvidia0", "/dev/nvidia-uvm": "/dev",
                    "/mnt/model store/llama": "/mnt/model store", "/etc/hosts": "/",
                    "/srv/gpuX/models": "/srv/gpuX", "/mnt/a/x": "/"}  # fmt: skip
    # mounted twice on the same target: the last mount is the one seen
    again = procfs.parse_mounts(MOUNTS + "none /dev/shm tmpfs ro 0 0\n")
    assert procfs.mount_of(again, "/dev/shm/x").options == ("ro",)
    assert (
        procfs.mount_of(procfs.parse_mounts("tmpfs /dev/ tmpfs rw 0 0\n"), "/dev/x").target
        == "/dev/"
    )
    assert procfs.mount_of([], "/") is None
    assert procfs.mount_of(procfs.parse_mounts("tmpfs /dev tmpfs rw 0 0\n"), "/etc") is None


def test_this_machines_own_mounts_hold_proc() -> None:
    mounts = procfs.parse_mounts(Path("/proc/self/mounts").read_text())
    assert procfs.mount_of(mounts, "/proc/self").fstype == "proc"


@pytest.mark.parametrize(
    ("uid_map", "overflow", "ranges", "over", "unprivileged", "root"),
    [("0 100000 65536\n", "65534\n", ((0, 100000, 65536),), 65534, True, 100000),
     ("0 0 4294967295\n", "65534", ((0, 0, 4294967295),), 65534, False, 0),
     ("0 100000 1000\n1000 1000 1\n1001 101001 64535\n", "  99  ",
      ((0, 100000, 1000), (1000, 1000, 1), (1001, 101001, 64535)), 99, True, 100000),
     ("1000 0 1\n", "x", ((1000, 0, 1),), 65534, True, None),
     ("0 0\nnot a map\n0 100000 x\n", "", ((0, 0, 4294967295),), 65534, False, 0),
     ("0 100000 0\n", None, ((0, 100000, 0),), 65534, True, None)],
)  # fmt: skip
def test_the_uid_map(uid_map, overflow, ranges, over, unprivileged, root) -> None:
    got = idmap.parse_idmap(uid_map, overflow)
    assert (got.ranges, got.overflow_uid, got.unprivileged, got.root_outside) == (
        ranges, over, unprivileged, root)  # fmt: skip
    assert got.unmapped_owner(0, over) is unprivileged
    assert got.unmapped_owner(over, 0) is unprivileged
    assert not got.unmapped_owner(0, 0)


def test_this_processes_own_uid_map() -> None:
    here = idmap.parse_idmap(Path(idmap.UID_MAP).read_text(), Path(idmap.OVERFLOW_UID).read_text())
    assert here.describe().startswith("uid_map ") and here.ranges
    assert (
        idmap.parse_idmap("0 100000 65536\n1 2 3\n", None).describe()
        == "uid_map 0 100000 65536, 1 2 3"
    )


@pytest.mark.parametrize(
    ("code", "name", "cause_words"),
    [(0, "CUDA_SUCCESS", ""), (3, "CUDA_ERROR_NOT_INITIALIZED", ""),
     (100, "CUDA_ERROR_NO_DEVICE", "no /dev/nvidiaN passed through, or CUDA_VISIBLE_DEVICES hides them all"),
     (101, "CUDA_ERROR_INVALID_DEVICE", "CUDA_VISIBLE_DEVICES names a GPU that is not there"),
     (304, "CUDA_ERROR_OPERATING_SYSTEM", "an unusable /proc"),
     (801, "CUDA_ERROR_NOT_SUPPORTED", "MIG misconfigured"),
     (802, "CUDA_ERROR_SYSTEM_NOT_READY", "nvidia-fabricmanager is not running or its version differs from the driver's"),
     (803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "libcuda in the container is not the host module's version"),
     (804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", "a cuda-compat libcuda on LD_LIBRARY_PATH"),
     (999, "CUDA_ERROR_UNKNOWN", "(/dev/nvidia-uvm denied by the cgroup device policy after its major changed)")],
)  # fmt: skip
def test_what_a_cuinit_result_is_explained_as(code: int, name: str, cause_words: str) -> None:
    meaning = cuda_errors.cu_meaning(code, "ignored", "ignored")
    assert (meaning.code, meaning.name) == (code, name)
    assert cause_words in meaning.likely_cause and bool(meaning.likely_cause) is bool(cause_words)
    assert meaning.meaning and meaning.meaning != "unknown code"


@pytest.mark.parametrize(
    ("code", "name", "cause_words"),
    [(0, "NVML_SUCCESS", ""), (4, "NVML_ERROR_NO_PERMISSION", "device nodes not accessible"),
     (9, "NVML_ERROR_DRIVER_NOT_LOADED", "no kernel module on the host, or /dev/nvidiactl missing"),
     (12, "NVML_ERROR_LIBRARY_NOT_FOUND", ""),
     (15, "NVML_ERROR_GPU_IS_LOST", "check dmesg for Xid 79 on the host"),
     (17, "NVML_ERROR_OPERATING_SYSTEM", "unusable /proc or /dev"),
     (18, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", "driver upgraded without reboot"),
     (999, "NVML_ERROR_UNKNOWN", "/dev/nvidiactl or a GPU node denied by the cgroup policy")],
)  # fmt: skip
def test_what_an_nvml_result_is_explained_as(code: int, name: str, cause_words: str) -> None:
    meaning = cuda_errors.nvml_meaning(code, "ignored")
    assert (meaning.code, meaning.name) == (code, name)
    assert cause_words in meaning.likely_cause and bool(meaning.likely_cause) is bool(cause_words)


def test_codes_not_in_the_tables_keep_the_drivers_own_words() -> None:
    assert cuda_errors.cu_meaning(719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure") == (
        cuda_errors.ErrorMeaning(719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure", ""))  # fmt: skip
    assert cuda_errors.cu_meaning(719) == cuda_errors.ErrorMeaning(
        719, "CUresult 719", "unknown code", ""
    )
    assert cuda_errors.nvml_meaning(13, "Not Found") == cuda_errors.ErrorMeaning(
        13, "NVML error 13", "Not Found", ""
    )
    assert cuda_errors.nvml_meaning(13) == cuda_errors.ErrorMeaning(
        13, "NVML error 13", "unknown code", ""
    )
