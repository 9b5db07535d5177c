"""The catalogue's verdicts on recorded machines (real captures from tests/data/recorded)."""

from __future__ import annotations

import errno

import pytest

from gpudoctor.context import CheckOptions, DeviceRequest
from gpudoctor.hosts.base import DiskUsage, FileStat
from gpudoctor.model import Report, Status
from gpudoctor.runner import run_checks
from tests.fakes.recorded_host import RecordedHost, stats_from_ls
from tests.recorded import recorded_file
from tests.unit.scenarios import h200_host, healthy_probe, incident_ct, mismatch_host


def run(host: RecordedHost, **options: object) -> Report:
    return run_checks(host, CheckOptions(**options))  # type: ignore[arg-type]


def findings(report: Report, check_id: str, status: Status | None = None):
    return [
        f
        for f in report.findings
        if f.check_id == check_id and (status is None or f.status == status)
    ]


def test_healthy_h200_passes_every_nvidia_check():
    report = run(h200_host())
    statuses = {r.check_id: r.status for r in report.results}
    for check_id in (
        "proc.usable",
        "driver.loaded",
        "device.nodes",
        "device.open",
        "nvml.init",
        "driver.userspace_match",
        "cuda.init",
        "gpu.health",
    ):
        assert statuses[check_id] == Status.PASS, (check_id, report.result(check_id))
    cuda = findings(report, "cuda.init")[0]
    assert "NVIDIA H200 (sm_90)" in cuda.message
    assert "580.159.04" in findings(report, "driver.loaded")[0].message


def test_incident_names_the_new_uvm_major_the_rule_and_the_fix():
    report = run(incident_ct(511), ct="200", fix_host="root@pve1")
    uvm = [
        f for f in findings(report, "device.open", Status.FAIL) if f.subject == "/dev/nvidia-uvm"
    ]
    assert len(uvm) == 1
    f = uvm[0]
    assert "(char 511:0, mode 0666) cannot be opened: EPERM" in f.message
    assert "denies major 511 (nvidia-uvm)" in f.message
    assert "lxc.cgroup2.devices.allow: c 511:* rwm" in f.remediation
    assert "/etc/pve/lxc/200.conf" in f.remediation
    assert f.fix_hint == "gpudoctor fix --host root@pve1 --ct 200"
    # the GPU nodes on 195 still open: only nvidia-uvm's major is denied
    assert findings(report, "device.open", Status.PASS)
    cuda = findings(report, "cuda.init")[0]
    assert cuda.status == Status.FAIL
    assert cuda.message.startswith(
        "cuInit(0) returned 999 CUDA_ERROR_UNKNOWN (caused by device.open)"
    )
    assert cuda.caused_by == ("device.open",)


def test_stale_node_from_an_earlier_boot_is_diagnosed_as_stale():
    host = h200_host()
    host.files["/proc/devices"] = host.files["/proc/devices"].replace(
        "238 nvidia-uvm", "510 nvidia-uvm"
    )
    report = run(host)
    stale = findings(report, "device.nodes", Status.FAIL)
    assert {f.subject for f in stale} == {"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
    assert all("stale" in f.message and "nvidia-uvm is major 510 now" in f.message for f in stale)
    assert all("c 510:* rwm" in f.remediation for f in stale)


def test_missing_uvm_node_is_missing_not_stale():
    host = h200_host()
    del host.nodes["/dev/nvidia-uvm"]
    report = run(host)
    fails = findings(report, "device.nodes", Status.FAIL)
    assert [f.subject for f in fails] == ["/dev/nvidia-uvm"]
    assert "does not exist although nvidia-uvm is loaded (major 238)" in fails[0].message
    assert "nvidia-modprobe -u -c=0" in fails[0].remediation
    assert "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file" in (
        fails[0].remediation
    )


def test_create_file_placeholder_is_not_a_device():
    """bslc's CT capture: nvidia-uvm-tools as an empty regular file (create=file leftover)."""
    host = h200_host()
    host.nodes["/dev/nvidia-uvm-tools"] = FileStat("/dev/nvidia-uvm-tools", "file", 0o644, size=0)
    fails = findings(run(host), "device.nodes", Status.FAIL)
    assert [f.subject for f in fails] == ["/dev/nvidia-uvm-tools"]
    assert "not a char device" in fails[0].message


def test_nvidia_frontend_name_of_older_drivers_is_accepted():
    """535.104.05 registers 195 as nvidia-frontend and uvm as 510 (nvidia-container-toolkit#115)."""
    host = h200_host()
    host.files["/proc/devices"] = recorded_file(
        "proc_devices/nvidia-container-toolkit-115_535.104.05_proc-devices.txt"
    )
    host.nodes = stats_from_ls(
        recorded_file("proc_devices/h200-lab_580.159.04_ls-dev-nvidia.txt")
        .replace("238,", "510,")
        .replace("241,", "236,")
    )
    report = run(host, only=("device.nodes",))
    assert report.result("device.nodes").status == Status.PASS  # type: ignore[union-attr]


def test_eacces_is_a_mode_problem_not_cgroup():
    host = h200_host()
    st = host.nodes["/dev/nvidia0"]
    host.nodes["/dev/nvidia0"] = FileStat(st.path, "char", 0o660, st.major, st.minor, gid=44)
    host.open_errno["/dev/nvidia0"] = errno.EACCES
    fail = findings(run(host), "device.open", Status.FAIL)[0]
    assert "EACCES" in fail.message and "file mode or ownership" in fail.message
    assert "cgroup" not in fail.message


def test_enxio_means_no_driver_behind_the_major():
    host = h200_host()
    host.open_errno["/dev/nvidia-uvm"] = errno.ENXIO
    fail = findings(run(host), "device.open", Status.FAIL)[0]
    assert "ENXIO" in fail.message and "No driver serves major 238" in fail.message


def test_broken_proc_explains_cuinit_304():
    host = h200_host()
    del host.files["/proc/self/status"]
    host.probe_lines = healthy_probe(cuda_rc=304)
    report = run(host)
    assert report.result("proc.usable").status == Status.FAIL  # type: ignore[union-attr]
    cuda = findings(report, "cuda.init")[0]
    assert cuda.caused_by == ("proc.usable",)
    assert "304 CUDA_ERROR_OPERATING_SYSTEM (caused by proc.usable)" in cuda.message


def test_no_proc_at_all_is_not_called_a_missing_driver_and_cuinit_still_runs():
    """A CT without any /proc (LXC's "Failed to mount temporary procfs", seen on the H200):
    driver.loaded cannot read the module's version, which proves nothing about the module,
    so it WARNs (not "load the module on the host") and cuda.init still runs and shows 304."""
    host = h200_host()
    for path in [p for p in host.files if p.startswith("/proc/")]:
        del host.files[path]
    host.probe_lines = healthy_probe(cuda_rc=304)
    report = run(host)
    assert report.result("proc.usable").status == Status.FAIL  # type: ignore[union-attr]
    driver = findings(report, "driver.loaded", Status.WARN)[0]
    assert driver.caused_by == ("proc.usable",)
    assert "modprobe" not in driver.remediation
    cuda = findings(report, "cuda.init", Status.FAIL)[0]
    assert "304 CUDA_ERROR_OPERATING_SYSTEM (caused by proc.usable)" in cuda.message


@pytest.mark.parametrize(
    "capture",
    [
        "outputs/failures/nvml-version-mismatch_truenas-nvidia-drivers-19.txt",
        "outputs/failures/nvml-version-mismatch_video2x-1226.txt",
    ],
)
def test_driver_library_mismatch(capture):
    host, lib, kernel = mismatch_host(capture)
    report = run(host)
    fail = findings(report, "driver.userspace_match", Status.FAIL)[0]
    assert f"libnvidia-ml {lib}" in fail.message and kernel in fail.message
    nvml = findings(report, "nvml.init", Status.FAIL)[0]
    assert "18 NVML_ERROR_LIB_RM_VERSION_MISMATCH" in nvml.message
    assert findings(report, "cuda.init")[0].caused_by == ("driver.userspace_match",)


def test_no_driver_skips_the_gpu_checks_with_the_reason():
    host = RecordedHost(
        files={"/proc/devices": "Character devices:\n  1 mem\n", "/proc/self/status": "Uid: 0\n"}
    )
    report = run(host, only=("cuda.init", "gpu.health"))
    assert report.result("driver.loaded").status == Status.FAIL  # type: ignore[union-attr]
    skipped = findings(report, "cuda.init", Status.SKIP)[0]
    assert skipped.message == "not run: driver.loaded FAIL"


def test_hung_cuinit_is_a_failure_not_a_hang():
    host = h200_host()
    host.probe_lines = [*healthy_probe()[:2], {"stage": "cuda", "started": True}]
    host.probe_hangs = True
    report = run(host, probe_timeout_s=0.5)
    cuda = findings(report, "cuda.init", Status.FAIL)[0]
    assert "did not return within 0.5 s" in cuda.message
    assert report.result("nvml.init").status == Status.PASS  # type: ignore[union-attr]


def test_gpu_health_warns_on_ecc_throttle_and_link_width():
    host = h200_host()
    dev = host.probe_lines[1]["devices"][0]  # type: ignore[index]
    dev.update(
        ecc_uncorrected_volatile=2,
        clocks_event_names=["HwSlowdown"],
        pcie_width_current=8,
        persistence_mode=0,
        processes=[{"pid": 4242, "used_memory": 4 << 30, "visible": False}],
    )
    warn = findings(run(host), "gpu.health", Status.WARN)[0]
    for text in (
        "2 uncorrected ECC",
        "HwSlowdown",
        "x8, below its x16",
        "persistence mode is off",
        "1 process(es) outside this system hold 4.0 GiB",
    ):
        assert text in warn.message


def test_recorded_h200_is_healthy_and_pcie_gen_below_max_is_not_a_warning():
    """The H200's real NVML values (recorded probe) are healthy; GPUs train their link down
    to a lower generation at idle, which is normal (only the width matters)."""
    host = h200_host()
    health = findings(run(host), "gpu.health")[0]
    assert health.status == Status.PASS
    assert "PCIe: gen 5/5 x16/x16 (cur/max)" in health.evidence
    host.probe_lines[1]["devices"][0]["pcie_gen_current"] = 1  # type: ignore[index]
    assert findings(run(host), "gpu.health")[0].status == Status.PASS


def test_extra_device_with_driver_name_checks_the_major():
    host = h200_host()
    host.files["/proc/devices"] = host.files["/proc/devices"].replace(
        "Character devices:\n", "Character devices:\n226 drm\n"
    )
    host.nodes["/dev/dri/card0"] = FileStat("/dev/dri/card0", "char", 0o660, 226, 0)
    host.nodes["/dev/dri/renderD128"] = FileStat("/dev/dri/renderD128", "char", 0o666, 227, 128)
    report = run(
        host,
        devices=(
            DeviceRequest("/dev/dri/card0", "drm"),
            DeviceRequest("/dev/dri/renderD128", "drm"),
        ),
        only=("device.nodes",),
    )
    by_subject = {f.subject: f.status for f in report.findings}
    assert by_subject["/dev/dri/card0"] == Status.PASS
    assert by_subject["/dev/dri/renderD128"] == Status.FAIL


def test_open_failure_of_a_stale_node_defers_to_device_nodes():
    """A stale node's EPERM must not advise allowing its OLD major."""
    host = h200_host()
    host.files["/proc/devices"] = host.files["/proc/devices"].replace(
        "238 nvidia-uvm", "510 nvidia-uvm"
    )
    host.open_errno["/dev/nvidia-uvm"] = errno.EPERM
    report = run(host)
    opened = next(f for f in findings(report, "device.open") if f.subject == "/dev/nvidia-uvm")
    assert opened.status == Status.FAIL and opened.caused_by == ("device.nodes",)
    assert "c 238:* rwm" not in opened.remediation and "re-create the node" in opened.remediation
    stale = next(f for f in findings(report, "device.nodes") if f.subject == "/dev/nvidia-uvm")
    assert "(no driver has major 238)" in stale.message


def test_shm_too_small_for_nccl_on_eight_gpus_warns():
    host = h200_host()
    host.disk["/dev/shm"] = DiskUsage(total=1 << 30, used=512 << 20, free=512 << 20)
    report = run(host, expect_gpus=8)
    shm = findings(report, "shm.capacity")[0]
    assert shm.status == Status.WARN
    assert "NCCL needs ~1024 MiB in /dev/shm for 8 GPUs" in shm.message
    assert findings(run(h200_host(), expect_gpus=8), "shm.capacity")[0].status == Status.PASS


def test_stale_node_whose_old_major_now_belongs_to_another_driver():
    """Node 511:0 from an earlier boot while /proc/devices has 510 nvidia-uvm and
    511 nvidia-caps: stale, and the message says who owns 511 now (issue 27)."""
    host = h200_host()
    host.files["/proc/devices"] = (
        host.files["/proc/devices"]
        .replace("238 nvidia-uvm", "510 nvidia-uvm")
        .replace("241 nvidia-caps\n", "511 nvidia-caps\n")
    )
    for path, minor in (("/dev/nvidia-uvm", 0), ("/dev/nvidia-uvm-tools", 1)):
        host.nodes[path] = FileStat(path, "char", 0o666, 511, minor)
    report = run(host)
    uvm = {f.subject: f for f in findings(report, "device.nodes", Status.FAIL)}
    for path in ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"):
        assert "stale" in uvm[path].message, uvm[path]
        assert "nvidia-uvm is major 510 now (major 511 is nvidia-caps now)" in uvm[path].message
        assert "c 510:* rwm" in uvm[path].remediation
    opened = [f for f in findings(report, "device.open") if f.subject == "/dev/nvidia-uvm"]
    assert "c 511:* rwm" not in opened[0].remediation


def test_a_skipped_requirement_blocks_gpu_health_in_a_ct_without_python3():
    """No python3 in the CT: nvml.init SKIPs, so gpu.health must SKIP for that reason, never
    PASS with "nothing to report" (issue 27: SKIP is not a healthy requirement)."""
    host = h200_host()
    host.has_python = False  # what ContainerHost says for a CT served by the sh agent
    report = run(host)
    assert report.result("nvml.init").status == Status.SKIP  # type: ignore[union-attr]
    health = findings(report, "gpu.health")
    assert [f.status for f in health] == [Status.SKIP]
    assert health[0].message == "not run: nvml.init SKIP"
    assert health[0].caused_by == ("nvml.init",)
