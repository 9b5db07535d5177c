"""gpudoctor/facts/driver_files.py: the host's NVIDIA user-space driver files, read from
``nvidia-container-cli list``, else the package owning libcuda (dpkg, rpm), else a scan of
libcuda's directory (what ``gpudoctor fix`` binds into a container). A Proxmox host with
the NVIDIA driver cannot exist here: tests/fakes/recorded_host.py answers with its files and
the outputs of those commands as the real tools print them."""

from __future__ import annotations

import pytest

from gpudoctor.facts.driver_files import (
    DriverFile,
    DriverFiles,
    driver_version,
    lib_dirs,
    read_driver_files,
)
from gpudoctor.hosts.base import FileStat
from tests.fakes.recorded_host import RecordedHost

V = "580.159.04"
LIB = "/usr/lib/x86_64-linux-gnu"
VERSION_LINE = f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {V}  Release Build\n"
LDCONFIG = (
    "1234 libs found in cache `/etc/ld.so.cache'\n"
    f"\tlibcuda.so.1 (libc6,x86-64) => {LIB}/libcuda.so.1\n"
    "\tlibcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1\n"
    f"\tlibcuda.so (libc6,x86-64) => {LIB}/libcuda.so\n"
)


@pytest.fixture(autouse=True)
def _no_overrides(monkeypatch):
    """The host's own files are read, not a test machine's overrides."""
    for name in ("NVIDIA_VERSION_FILE", "DRIVER_LIB_DIRS", "DRIVER_BIN_DIRS"):
        monkeypatch.delenv(f"GPUDOCTOR_{name}", raising=False)


def driver_host(*names: str, commands: dict[str, tuple[int, str]] | None = None) -> RecordedHost:
    """Return a host with driver V loaded, ``names`` in LIB, ``ldconfig -p`` finding LIB."""
    files = {"/proc/driver/nvidia/version": VERSION_LINE}
    files.update({f"{LIB}/{n}": "" for n in names})
    return RecordedHost(files=files, commands={"ldconfig -p": (0, LDCONFIG), **(commands or {})})


RUNFILE_LIBS = (
    f"libcuda.so.{V}",
    "libcuda.so.1",
    "libcuda.so",
    f"libnvidia-ml.so.{V}",
    "libnvidia-ml.so.1",
    f"libnvidia-ptxjitcompiler.so.{V}",
    "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-ptxjitcompiler.so.10",
    f"libnvidia-gpucomp.so.{V}",  # no soname link beside it
    "libz.so.1",
)


# ---------------------------------------------------------------------------- version, dirs


def test_the_version_is_the_loaded_modules():
    assert driver_version(driver_host()) == V
    assert driver_version(RecordedHost()) == ""  # no module: no /proc/driver/nvidia/version
    odd = RecordedHost(files={"/proc/driver/nvidia/version": "NVRM: something else\n"})
    assert driver_version(odd) == ""


def test_the_version_file_can_be_named(monkeypatch):
    host = RecordedHost(files={"/tmp/v": VERSION_LINE.replace(V, "550.54.15")})
    monkeypatch.setenv("GPUDOCTOR_NVIDIA_VERSION_FILE", "/tmp/v")
    assert driver_version(host) == "550.54.15"


def test_lib_dirs_are_the_64_bit_dirs_of_libcuda_so_1_once_each():
    ldconfig = LDCONFIG + (
        f"\tlibcuda.so.1 (libc6,x86-64, OS ABI: Linux 3.2.0) => {LIB}/libcuda.so.1\n"
        "\tlibcuda.so.1 (libc6,AArch64) => /usr/lib/aarch64-linux-gnu/libcuda.so.1\n"
        "\tlibcuda.so.1 (libc6,x86-64) => relative/libcuda.so.1\n"
        "\tlibcuda.so.10 (libc6,x86-64) => /opt/x/libcuda.so.10\n"
        "\tlibcuda.so.1 (libc6,x86-64) => /opt/cuda/lib64/libcuda.so.1 extra\n"
        "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/libcuda.so.1\n"  # Arch: 64-bit in /usr/lib
        "\tlibcuda.so.1 (libc6) => /usr/lib64/32/libcuda.so.1\n"
    )
    host = RecordedHost(commands={"ldconfig -p": (0, ldconfig)})
    assert lib_dirs(host) == [LIB, "/usr/lib/aarch64-linux-gnu", "/usr/lib"]


def test_lib_dirs_are_none_when_ldconfig_fails():
    assert lib_dirs(RecordedHost(commands={"ldconfig -p": (1, LDCONFIG)})) == []
    assert lib_dirs(RecordedHost()) == []  # no ldconfig at all


def test_lib_dirs_can_be_named(monkeypatch):
    monkeypatch.setenv("GPUDOCTOR_DRIVER_LIB_DIRS", "/a::/b/c:")
    assert lib_dirs(RecordedHost(commands={"ldconfig -p": (0, LDCONFIG)})) == ["/a", "/b/c"]


# ---------------------------------------------------------------------------- no list


def test_no_loaded_module_is_an_error_saying_so():
    assert read_driver_files(RecordedHost()) == DriverFiles(
        "", error="no NVIDIA kernel module is loaded (no driver version)"
    )


def test_libcuda_nowhere_the_loader_looks_is_an_error_naming_the_dirs():
    found = read_driver_files(driver_host("libcuda.so.1"))
    assert found == DriverFiles(V, error=f"libcuda.so.{V} is not in {LIB}")
    two = driver_host("libcuda.so.1")
    two.commands["ldconfig -p"] = (
        0,
        LDCONFIG + "\tlibcuda.so.1 (libc6,x86-64) => /opt/nv/libcuda.so.1\n",
    )
    assert read_driver_files(two).error == f"libcuda.so.{V} is not in {LIB}, /opt/nv"
    bare = RecordedHost(files={"/proc/driver/nvidia/version": VERSION_LINE})
    assert read_driver_files(bare).error == (
        f"libcuda.so.{V} is not in no directory (ldconfig -p knows no libcuda.so.1)"
    )


# ---------------------------------------------------------------------------- the scan


def test_a_runfile_install_is_scanned_with_each_librarys_soname_link():
    host = driver_host(*RUNFILE_LIBS, f"libnvidia-ml.so.{V}.bak")
    host.files["/usr/bin/nvidia-smi"] = ""
    found = read_driver_files(host)
    assert found.version == V and found.error == ""
    assert found.source == f"scan of {LIB} for *.so.{V}"
    assert found.files == (
        DriverFile(f"{LIB}/libcuda.so.{V}", "lib", f"{LIB}/libcuda.so.1"),
        DriverFile(f"{LIB}/libnvidia-gpucomp.so.{V}", "lib", ""),
        DriverFile(f"{LIB}/libnvidia-ml.so.{V}", "lib", f"{LIB}/libnvidia-ml.so.1"),
        DriverFile(f"{LIB}/libnvidia-ptxjitcompiler.so.{V}", "lib",
                   f"{LIB}/libnvidia-ptxjitcompiler.so.1"),
        DriverFile("/usr/bin/nvidia-smi", "bin"),
    )  # fmt: skip
    assert found.files[0].name == f"libcuda.so.{V}"
    assert [f.name for f in found.of_kind("bin")] == ["nvidia-smi"]
    assert found.of_kind("firmware") == []


def test_nvidia_smi_is_taken_from_the_first_bin_dir_holding_it():
    host = driver_host(f"libcuda.so.{V}")
    host.files["/usr/local/bin/nvidia-smi"] = ""
    host.files["/usr/sbin/nvidia-smi"] = ""
    assert read_driver_files(host).of_kind("bin") == [
        DriverFile("/usr/local/bin/nvidia-smi", "bin")
    ]
    assert read_driver_files(driver_host(f"libcuda.so.{V}")).of_kind("bin") == []
    sbin_only = driver_host(f"libcuda.so.{V}")
    sbin_only.files["/usr/sbin/nvidia-smi"] = ""
    assert read_driver_files(sbin_only).of_kind("bin") == [
        DriverFile("/usr/sbin/nvidia-smi", "bin")
    ]


def test_the_bin_dirs_can_be_named(monkeypatch):
    host = driver_host(f"libcuda.so.{V}")
    host.files["/usr/bin/nvidia-smi"] = ""
    host.files["/opt/nv/bin/nvidia-smi"] = ""
    monkeypatch.setenv("GPUDOCTOR_DRIVER_BIN_DIRS", "::/opt/nv/bin")
    assert read_driver_files(host).of_kind("bin") == [DriverFile("/opt/nv/bin/nvidia-smi", "bin")]


def test_the_loaded_versions_firmware_is_added_when_present():
    host = driver_host(f"libcuda.so.{V}")
    host.nodes[f"/lib/firmware/nvidia/{V}"] = FileStat(f"/lib/firmware/nvidia/{V}", "dir", 0o755)
    host.nodes["/lib/firmware/nvidia/550.54.15"] = FileStat("/x", "dir", 0o755)
    assert read_driver_files(host).files[-1] == DriverFile(f"/lib/firmware/nvidia/{V}", "firmware")
    assert read_driver_files(host).of_kind("firmware") == [
        DriverFile(f"/lib/firmware/nvidia/{V}", "firmware")
    ]


def test_the_first_loader_dir_holding_this_versions_libcuda_is_scanned(monkeypatch):
    host = driver_host()
    host.files.update({"/old/libcuda.so.550.54.15": "", f"/new/libcuda.so.{V}": "",
                       f"/new/libnvidia-ml.so.{V}": "", f"/newer/libcuda.so.{V}": ""})  # fmt: skip
    monkeypatch.setenv("GPUDOCTOR_DRIVER_LIB_DIRS", "/old:/new:/newer")
    found = read_driver_files(host)
    assert found.source == f"scan of /new for *.so.{V}"
    assert [f.path for f in found.files] == [f"/new/libcuda.so.{V}", f"/new/libnvidia-ml.so.{V}"]


# ---------------------------------------------------------------------------- packages


def test_a_debian_package_lists_the_files_of_libcudas_owner():
    lib = f"{LIB}/libcuda.so.{V}"
    listing = "\n".join(
        ["/.", "/usr", LIB, lib, f"{LIB}/libcuda.so.1", f"{LIB}/libnvidia-nvvm.so.{V}",
         "/usr/share/doc/libnvidia-compute-580/copyright", "/usr/bin/nvidia-smi",
         "/usr/bin/nvidia-debugdump", "/usr/bin/gpu-tool", f"/lib/firmware/nvidia/{V}/",
         f"/lib/firmware/nvidia/{V}/gsp_ga10x.bin", "/lib/firmware/nvidia/550.54.15"]
    )  # fmt: skip
    host = driver_host(
        f"libcuda.so.{V}",
        "libcuda.so.1",
        commands={
            f"dpkg -S {lib}": (0, f"libnvidia-compute-580, libcuda1-580: {lib}\n"),
            "dpkg -L libnvidia-compute-580": (0, listing),
        },
    )
    host.files["/usr/sbin/nvidia-smi"] = ""  # the package lists its own
    host.nodes[f"/lib/firmware/nvidia/{V}"] = FileStat(f"/lib/firmware/nvidia/{V}", "dir", 0o755)
    found = read_driver_files(host)
    assert found.source == "dpkg -L libnvidia-compute-580"
    assert found.files == (
        DriverFile(lib, "lib", f"{LIB}/libcuda.so.1"),
        DriverFile(f"{LIB}/libnvidia-nvvm.so.{V}", "lib"),
        DriverFile("/usr/bin/nvidia-smi", "bin"),
        DriverFile("/usr/bin/nvidia-debugdump", "bin"),
        DriverFile(f"/lib/firmware/nvidia/{V}/", "firmware"),
    )


def test_a_multiarch_owner_is_named_without_its_architecture():
    lib = f"{LIB}/libcuda.so.{V}"
    host = driver_host(
        f"libcuda.so.{V}",
        commands={
            f"dpkg -S {lib}": (0, f"libnvidia-compute-580:amd64: {lib}\n"),
            "dpkg -L libnvidia-compute-580": (0, f"{lib}\n"),
        },
    )
    assert read_driver_files(host).source == "dpkg -L libnvidia-compute-580"


def test_an_rpm_package_is_asked_when_dpkg_knows_no_owner():
    lib = f"{LIB}/libcuda.so.{V}"
    owner = f"nvidia-driver-cuda-libs-{V}-1.el9.x86_64"
    host = driver_host(
        f"libcuda.so.{V}",
        commands={
            f"dpkg -S {lib}": (1, f"dpkg-query: no path found matching pattern {lib}\n"),
            f"rpm -qf {lib}": (0, owner + "\n"),
            f"rpm -ql {owner}": (0, f"{lib}\n/usr/bin/nvidia-smi\n"),
        },
    )
    found = read_driver_files(host)
    assert found.source == f"rpm -ql {owner}"
    assert [f.path for f in found.files] == [lib, "/usr/bin/nvidia-smi"]


def test_rpm_is_asked_when_dpkg_lists_nothing_for_the_owner():
    lib = f"{LIB}/libcuda.so.{V}"
    host = driver_host(
        f"libcuda.so.{V}",
        commands={
            f"dpkg -S {lib}": (0, f"libnvidia-compute-580: {lib}\n"),
            "dpkg -L libnvidia-compute-580": (1, ""),
            f"rpm -qf {lib}": (0, "nvidia-libs\n"),
            "rpm -ql nvidia-libs": (0, f"{lib}\n"),
        },
    )
    assert read_driver_files(host).source == "rpm -ql nvidia-libs"


def test_a_file_no_package_owns_falls_back_to_the_scan():
    lib = f"{LIB}/libcuda.so.{V}"
    for rpm_answer in [(0, f"file {lib} is not owned by any package\n"), (1, "")]:
        host = driver_host(f"libcuda.so.{V}", commands={f"rpm -qf {lib}": rpm_answer})
        assert read_driver_files(host).source == f"scan of {LIB} for *.so.{V}"
    owned = driver_host(
        f"libcuda.so.{V}", commands={f"rpm -qf {lib}": (0, "nvidia-libs\n"),
                                     "rpm -ql nvidia-libs": (0, "\n")}
    )  # fmt: skip
    assert read_driver_files(owned).source == f"scan of {LIB} for *.so.{V}"


# ---------------------------------------------------------------------------- container cli


CLI_LIST = "\n".join(
    [
        "/dev/nvidiactl",
        "/dev/nvidia0",
        "/run/nvidia-persistenced/socket",
        "/usr/bin/nvidia-smi",
        "/usr/bin/nvidia-persistenced",
        f"{LIB}/libcuda.so.{V}",
        f"{LIB}/libcuda.so.{V}",
        f"{LIB}/libnvidia-ml.so.{V}",
        f"/lib/firmware/nvidia/{V}/gsp_tu10x.bin",
        f"/usr/lib/firmware/nvidia/{V}",
        "relative/libnvidia-x.so.1",
        f"relative/libnvidia-y.so.{V}",
        f"/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{V}",
        f"/dev/shm/libnvidia-z.so.{V}",
    ]
)


def test_nvidia_container_cli_list_comes_first():
    host = driver_host(*RUNFILE_LIBS, commands={"nvidia-container-cli list": (0, CLI_LIST)})
    found = read_driver_files(host)
    assert found.source == "nvidia-container-cli list" and found.version == V
    assert found.files == (
        DriverFile("/usr/bin/nvidia-smi", "bin"),
        DriverFile("/usr/bin/nvidia-persistenced", "bin"),
        DriverFile(f"{LIB}/libcuda.so.{V}", "lib", f"{LIB}/libcuda.so.1"),
        DriverFile(f"{LIB}/libnvidia-ml.so.{V}", "lib", f"{LIB}/libnvidia-ml.so.1"),
        DriverFile(f"/usr/lib/firmware/nvidia/{V}", "firmware"),
    )


def test_a_library_dir_that_cannot_be_listed_gives_no_soname_link():
    cli = f"/gone/libcuda.so.{V}\n/gone/libcuda.so.1\n"
    host = driver_host(commands={"nvidia-container-cli list": (0, cli)})
    found = read_driver_files(host)
    assert found.files == (DriverFile(f"/gone/libcuda.so.{V}", "lib"),)


def test_a_useless_container_cli_list_falls_back_to_the_loader(monkeypatch):
    only_devices = "/dev/nvidiactl\n/dev/nvidia0\n/usr/share/doc/x\n"
    host = driver_host(f"libcuda.so.{V}", commands={"nvidia-container-cli list": (0, only_devices)})
    assert read_driver_files(host).source == f"scan of {LIB} for *.so.{V}"
    failed = driver_host(f"libcuda.so.{V}", commands={"nvidia-container-cli list": (1, CLI_LIST)})
    assert read_driver_files(failed).source == f"scan of {LIB} for *.so.{V}"


def test_named_lib_dirs_skip_nvidia_container_cli(monkeypatch):
    host = driver_host(f"libcuda.so.{V}", commands={"nvidia-container-cli list": (0, CLI_LIST)})
    monkeypatch.setenv("GPUDOCTOR_DRIVER_LIB_DIRS", LIB)
    assert read_driver_files(host).source == f"scan of {LIB} for *.so.{V}"


def test_blank_lines_and_spaces_around_paths_are_ignored():
    cli = f"\n   {LIB}/libcuda.so.{V}  \n\n"
    host = driver_host(*RUNFILE_LIBS, commands={"nvidia-container-cli list": (0, cli)})
    assert read_driver_files(host).files == (
        DriverFile(f"{LIB}/libcuda.so.{V}", "lib", f"{LIB}/libcuda.so.1"),
    )
