"""``fix --driver-libs``: the plan that binds the host's driver files into a CT, or the
commands that copy them in, pinned on real config texts (the lab test
``test_driver_libs_lab.py`` runs the same plan in a real container; these run without it).

The driver list is what :mod:`gpudoctor.facts.driver_files` reads on a host with driver
580.159.04 (``nvidia-container-cli list``): a library with its soname link, one without,
``nvidia-smi``, the firmware directory.
"""

from __future__ import annotations

from gpudoctor.facts.driver_files import DriverFile, DriverFiles
from gpudoctor.pve.config import LXC, parse
from gpudoctor.pve.driver_libs import (
    LD_CONF,
    LIB_DIR,
    add_binds,
    add_copy,
    binds_for,
    bound_entries,
    copy_commands,
    ldconfig_script,
    managed,
)
from gpudoctor.pve.planner import Edit, FixPlan

V = "580.159.04"
LIB = "/usr/lib/x86_64-linux-gnu"
FILES = DriverFiles(
    V,
    "nvidia-container-cli list",
    (
        DriverFile(f"{LIB}/libcuda.so.{V}", "lib", f"{LIB}/libcuda.so.1"),
        DriverFile(f"{LIB}/libnvidia-gpucomp.so.{V}", "lib"),
        DriverFile("/usr/bin/nvidia-smi", "bin"),
        DriverFile(f"/lib/firmware/nvidia/{V}", "firmware"),
        DriverFile("/etc/vulkan/icd.d/nvidia_icd.json", "config"),  # not a kind bound
    ),
)
CUDA = f"lxc.mount.entry: {LIB}/libcuda.so.1 usr/lib/gpudoctor-driver/libcuda.so.1 none bind,ro,optional,create=file"
GPUCOMP = (
    f"lxc.mount.entry: {LIB}/libnvidia-gpucomp.so.{V} usr/lib/gpudoctor-driver/"
    f"libnvidia-gpucomp.so.{V} none bind,ro,optional,create=file"
)
SMI = "lxc.mount.entry: /usr/bin/nvidia-smi usr/bin/nvidia-smi none bind,ro,optional,create=file"
FIRMWARE = (
    f"lxc.mount.entry: /lib/firmware/nvidia/{V} lib/firmware/nvidia/{V} none "
    "bind,ro,optional,create=dir"
)
NEW_LINES = [CUDA, GPUCOMP, SMI, FIRMWARE]


def plan_of(text: str) -> FixPlan:
    return FixPlan(text, text, (Edit("add", "dev0: /dev/nvidia0", "planned before"),),
                   explanation=("earlier note",), warnings=("earlier warning",))  # fmt: skip


def test_each_driver_file_is_bound_where_the_ct_finds_it() -> None:
    binds = binds_for(FILES)
    assert [(b.source, b.target, b.is_dir) for b in binds] == [
        (f"{LIB}/libcuda.so.1", f"{LIB_DIR}/libcuda.so.1", False),  # the link: follows upgrades
        (f"{LIB}/libnvidia-gpucomp.so.{V}", f"{LIB_DIR}/libnvidia-gpucomp.so.{V}", False),
        ("/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi", False),
        (f"/lib/firmware/nvidia/{V}", f"/lib/firmware/nvidia/{V}", True),
    ]
    cuda, gpucomp, smi, firmware = binds
    assert cuda.reason == (
        f"libcuda.so.{V} (nvidia-container-cli list); bound through its soname link "
        "libcuda.so.1, so a CT restart after a host driver upgrade binds the new version"
    )
    assert gpucomp.reason == (
        f"libnvidia-gpucomp.so.{V} (nvidia-container-cli list); versioned name: re-run fix "
        "after an upgrade"
    )
    assert smi.reason == "nvidia-smi of the host's driver (nvidia-container-cli list)"
    assert firmware.reason == "the driver's firmware (nvidia-container-cli list)"
    assert [b.value for b in binds] == [ln.split(": ", 1)[1] for ln in NEW_LINES]


def test_only_the_library_directory_and_the_firmware_are_managed() -> None:
    assert managed(f"{LIB_DIR}/libcuda.so.1")
    assert managed(f"/lib/firmware/nvidia/{V}")
    assert not managed(LIB_DIR)  # the directory itself is no bind of ours
    assert not managed(f"{LIB_DIR}-old/libcuda.so.1")
    assert not managed("/usr/bin/nvidia-smi")  # a binary over its own path: the CT's too
    assert not managed("/lib/firmware/nvidia")


def test_binds_go_after_the_last_mount_entry_and_every_edit_says_why() -> None:
    old = (
        "arch: amd64\n"
        "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n"
        "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file\n"
        "lxc.cgroup2.devices.allow: c 195:* rwm\n"
    )
    plan = add_binds(plan_of(old), FILES, "/etc/pve/lxc/101.conf")
    lines = plan.new_text.splitlines()
    assert lines == [*old.splitlines()[:3], *NEW_LINES, old.splitlines()[3]]
    assert plan.old_text == old
    assert plan.edits[0] == Edit("add", "dev0: /dev/nvidia0", "planned before")
    assert [(e.action, e.line) for e in plan.edits[1:]] == [("add", ln) for ln in NEW_LINES]
    assert plan.edits[1].reason == binds_for(FILES)[0].reason
    assert plan.explanation[0] == "earlier note"
    assert plan.explanation[1] == f"add `{CUDA}`: {binds_for(FILES)[0].reason}"
    assert plan.explanation[-1] == (
        f"after the start, inside the CT: {LD_CONF} names {LIB_DIR}, then `ldconfig` "
        "(once; later restarts need nothing)"
    )
    assert len(plan.explanation) == 1 + len(NEW_LINES) + 1
    assert plan.warnings == ("earlier warning",)
    assert plan.diff.startswith("--- a/etc/pve/lxc/101.conf\n+++ b/etc/pve/lxc/101.conf")
    assert f"+{CUDA}\n" in plan.diff


def test_without_mount_entries_the_binds_follow_the_last_line_and_keep_its_style() -> None:
    old = "lxc.cgroup2.devices.allow = c 195:* rwm\r\nlxc.apparmor.profile = unconfined\r\n\n"
    plan = add_binds(plan_of(old), FILES, "config")
    lines = parse(plan.new_text, LXC).lines
    texts = [ln.text for ln in lines]
    assert texts[:2] == ["lxc.cgroup2.devices.allow = c 195:* rwm\r",
                         "lxc.apparmor.profile = unconfined\r"]  # fmt: skip
    assert texts[2] == CUDA.replace(": ", " = ", 1) + "\r"  # the neighbour's separator and CRLF
    assert texts[-1] == ""  # the blank line stays last


def test_an_empty_config_gets_the_binds_at_the_top() -> None:
    plan = add_binds(plan_of(""), FILES, "config")
    assert plan.new_text.splitlines() == NEW_LINES


def test_a_second_run_adds_nothing_and_a_stale_bind_is_removed() -> None:
    once = add_binds(plan_of("arch: amd64\n"), FILES, "config").new_text
    twice = add_binds(plan_of(once), FILES, "config")
    assert twice.new_text == once and twice.edits == plan_of(once).edits and twice.diff == ""
    # the host was upgraded: the versioned file of the old driver is not listed any more
    old_v = "580.95.05"
    stale = (
        f"lxc.mount.entry: {LIB}/libnvidia-gpucomp.so.{old_v} usr/lib/gpudoctor-driver/"
        f"libnvidia-gpucomp.so.{old_v} none bind,ro,optional,create=file"
    )
    mine = "lxc.mount.entry: /srv/data srv/data none bind,create=dir"  # not ours: kept
    not_bind = f"lxc.mount.entry: tmpfs {LIB_DIR[1:]}/scratch tmpfs defaults 0 0"  # kept
    text = f"{once}{stale}\n{mine}\n{not_bind}\n"
    plan = add_binds(plan_of(text), FILES, "config")
    assert plan.new_text == f"{once}{mine}\n{not_bind}\n"
    (removed,) = plan.edits[1:]
    assert removed == Edit(
        "remove", stale,
        f"{LIB}/libnvidia-gpucomp.so.{old_v} is not a file of the host's driver {V} any more",
    )  # fmt: skip
    assert plan.explanation[1] == f"remove `{stale}`: {removed.reason}"


def test_a_bind_written_with_an_absolute_target_counts_as_present() -> None:
    text = CUDA.replace(" usr/lib/", " /usr/lib/") + "\n"
    config = parse(text)
    assert bound_entries(config) == [(0, f"{LIB}/libcuda.so.1", f"{LIB_DIR}/libcuda.so.1")]
    plan = add_binds(plan_of(text), FILES, "config")
    assert [e.line for e in plan.edits[1:]] == NEW_LINES[1:]
    assert bound_entries(parse("#" + CUDA + "\n")) == []  # a comment binds nothing
    assert bound_entries(parse("lxc.mount.entry: /x\n")) == []  # malformed: no entry
    hook = CUDA.replace("lxc.mount.entry", "lxc.hook.mount")  # another key: no mount at all
    assert bound_entries(parse(hook + "\n")) == []


def test_the_ldconfig_step_writes_the_conf_atomically_then_runs_ldconfig() -> None:
    script = ldconfig_script()
    assert script.startswith("set -e; mkdir -p /etc/ld.so.conf.d; ")
    write = f"printf '%s\\n' {LIB_DIR} > {LD_CONF}.tmp.$$ && mv -f {LD_CONF}.tmp.$$ {LD_CONF}; "
    assert write in script
    assert script.endswith("; ldconfig")


def test_copy_mode_prints_the_exact_version_and_warns_that_it_will_break() -> None:
    commands = copy_commands(FILES)
    assert (
        commands[0]
        == "# the NVIDIA .run installer of the host's version, without the kernel module:"
    )
    assert commands[2] == f"# or Debian/Ubuntu packages pinned to {V} (the CT's apt must offer it):"
    assert f"sh NVIDIA-Linux-x86_64-{V}.run --no-kernel-module --silent" in commands
    assert f"apt-get install -y libnvidia-compute-580={V}-* nvidia-utils-580={V}-*" in commands
    assert commands[-1] == "apt-mark hold libnvidia-compute-580 nvidia-utils-580"
    assert len(commands) == 5
    plan = add_copy(plan_of("arch: amd64\n"), FILES)
    assert plan.new_text == plan.old_text  # nothing in the config changes
    assert plan.explanation == (
        "earlier note", f"inside the CT, install driver {V} (copies):", *commands)  # fmt: skip
    assert plan.warnings == (
        "earlier warning",
        f"copies of driver {V} in the CT break at the next host driver upgrade (Driver/library "
        "version mismatch); `fix --driver-libs bind` follows the host instead",
    )


def test_a_one_line_config_gives_its_line_ending_to_the_binds() -> None:
    plan = add_binds(plan_of("lxc.apparmor.profile: unconfined\r\n"), FILES, "config")
    assert plan.new_text.split("\n") == [
        "lxc.apparmor.profile: unconfined\r", *(ln + "\r" for ln in NEW_LINES), ""]  # fmt: skip
