"""A lab CT that runs a benchmark campaign from its boot unit (`gpudoctor service install`).

Lab CTs have no systemd as PID 1 (their init is a busybox ``sh`` loop, tests/lab), so this
CT's init is :data:`BOOT_INIT`: a stand-in for systemd's boot of ``multi-user.target``. At
every start it reads each unit enabled in ``/etc/systemd/system/multi-user.target.wants``,
honours its ``ConditionPathExists=!PATH``, and starts the unit's own ``ExecStart=`` command
(the wrapper `gpudoctor service install` wrote), its output appended to
``/var/log/<unit>.log`` (the journal's stand-in). Nothing else starts the campaign.

The CT shares the host's /usr and /etc read-only (tests/lab/README.md); two writable
directories of the test are bind-mounted over ``/etc/systemd/system`` and
``/usr/local/sbin`` so the unit and its wrapper can be installed INSIDE the CT by
``gpudoctor service install`` run there. The campaign's state (plan, run directory, the
weights mirror) lives in the CT's own rootfs (persistent, like a CT's disk); the weights go
to the CT's /dev/shm, a tmpfs that every stop wipes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from tests.bench.campaign_support import STREAM_SERVER
from tests.lab.lxc import REPO_ROOT, Lab, LabContainer
from tests.weights.hub_server import HubServer

BOOT_INIT = """#!/usr/bin/busybox sh
# Lab stand-in for systemd as PID 1 (tests/ops/campaign_ct.py): start every enabled unit.
trap 'exit 0' TERM PWR INT
bb=/usr/bin/busybox
$bb mkdir -p /var/log
$bb ip link set lo up  # what a real boot does before multi-user.target (ifupdown/networkd)
for unit in /etc/systemd/system/multi-user.target.wants/*.service; do
  [ -e "$unit" ] || continue
  name=${unit##*/}
  cond=$($bb sed -n 's/^ConditionPathExists=!//p' "$unit")
  if [ -n "$cond" ] && [ -e "$cond" ]; then
    echo "boot: $name skipped: ConditionPathExists=!$cond" >> /var/log/boot.log
    continue
  fi
  cmd=$($bb sed -n 's/^ExecStart=//p' "$unit")
  echo "boot: $name: $cmd" >> /var/log/boot.log
  $cmd >> "/var/log/$name.log" 2>&1 &
done
while :; do $bb sleep 3600 & wait $!; done
"""

REPO_ID = "org/tiny"
MIRROR = "/var/lib/models"
SHM_DIR = "/dev/shm/tiny"
PLAN = "/var/lib/campaign/plan.toml"
OUT = "/var/lib/campaign/run"
UNIT = "gpudoctor-campaign.service"
CONFIGS = ("a", "b", "c")
CONCURRENCY = (1, 2, 3)


def plan_text() -> str:
    """Return the campaign: 3 configs x 3 concurrencies against stream_server.py (a real
    OpenAI-compatible streaming server; it counts tokens with the model's tokenizer, so it
    reads the weights directory the unit restored), model from the mirror into tmpfs."""
    command = [sys.executable, str(STREAM_SERVER), "--model", "{model}", "--host", "{host}",
               "--port", "{port}"]  # fmt: skip
    configs = "".join(
        f'[[configs]]\nname = "{name}"\nargs = {{ token-delay-ms = {20 + i} }}\n'
        for i, name in enumerate(CONFIGS)
    )
    return (
        textwrap.dedent(f"""\
        name = "drill"
        [model]
        repo = "{REPO_ID}"
        dir = "{SHM_DIR}"
        mirror = "{MIRROR}"
        [engine]
        name = "command"
        command = [{", ".join(f'"{w}"' for w in command)}]
        version = "stub-1"
        startup_timeout_s = 60
        stop_timeout_s = 5
        [axes]
        concurrency = {list(CONCURRENCY)}
        [preflight]
        only = ["model"]
        [workload]
        input_len = 32
        output_len = 8
        num_prompts = 6
        warmup = 0
        """)
        + configs
    )


@dataclass
class CampaignCt:
    """The CT and where its pieces are on this machine."""

    ct: LabContainer
    node: Path  # the stand-in GPU node on the host (bind-mounted as /dev/fakegpu)

    def host_path(self, inside: str) -> Path:
        """Return the host path of a file of the CT's rootfs (not /usr, /etc: shared)."""
        return self.ct.rootfs / inside.lstrip("/")

    @property
    def results(self) -> Path:
        return self.host_path(OUT) / "results.jsonl"

    def unit_log(self) -> str:
        """Return the unit's output over every boot (the journal's stand-in)."""
        path = self.host_path(f"/var/log/{UNIT}.log")
        return path.read_text(errors="replace") if path.exists() else ""

    def boot_log(self) -> str:
        path = self.host_path("/var/log/boot.log")
        return path.read_text() if path.exists() else ""

    def done(self) -> bool:
        """Return True once the wrapper left the done marker AND logged "campaign done"
        (the marker is created first, by `service mark-done`, then the line is written)."""
        marker = self.host_path(f"{OUT}/.gpudoctor-service-done")
        return marker.is_file() and "campaign done" in self.unit_log()

    def records(self) -> int:
        """Return the number of lines in results.jsonl (finished cells)."""
        return self.results.read_bytes().count(b"\n") if self.results.exists() else 0

    def wait(self, predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
        """Poll ``predicate()`` every 50 ms; AssertionError naming ``what`` with the unit's
        log when it is still false after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{what}: not after {timeout:.0f} s\n{self.unit_log()[-3000:]}"
                )
            time.sleep(0.05)


def seed_mirror(mirror_root: Path, model_dir: Path, work: Path) -> None:
    """Fill ``mirror_root`` the way a first download does: ``gpudoctor weights ensure
    org/tiny --to WORK/tiny --mirror MIRROR_ROOT`` against a Hub stand-in on loopback
    (tests/weights/hub_server.py) serving the tiny model's files."""
    hub = HubServer(work / "hub-storage")
    repo = hub.add_repo(REPO_ID)
    repo.commit({p.name: p for p in sorted(model_dir.iterdir()) if p.is_file()})
    url = hub.start()
    try:
        env = {**os.environ, "HF_ENDPOINT": url, "HF_HOME": str(work / "hf-home"),
               "HF_HUB_DISABLE_TELEMETRY": "1", "PYTHONPATH": str(REPO_ROOT)}  # fmt: skip
        env.pop("HF_TOKEN", None)
        done = subprocess.run(
            [sys.executable, "-m", "gpudoctor", "weights", "ensure", REPO_ID,
             "--to", str(work / "seed" / "tiny"), "--mirror", str(mirror_root), "-q"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
    finally:
        hub.stop()
    assert done.returncode == 0, done.stderr[-2000:]


def prepare_campaign_ct(
    lab: Lab, model_dir: Path, work: Path, node: Path, name: str | None = None,
    devices: dict[str, str] | None = None, allow: tuple[str, ...] = (),
) -> CampaignCt:  # fmt: skip
    """Create (not start) the CT: writable unit dirs, the boot init, the plan and a
    seeded weights mirror in its rootfs. ``node`` is the stand-in GPU on the host."""
    units, sbin = work / "etc-systemd-system", work / "usr-local-sbin"
    units.mkdir(parents=True)
    sbin.mkdir(parents=True)
    ct = lab.container(
        name=name or lab.unique_name("ops"),
        devices=devices or {},
        allow=allow,
        start=False,
        extra_config=[
            f"lxc.mount.entry = {units} etc/systemd/system none rw,bind 0 0",
            f"lxc.mount.entry = {sbin} usr/local/sbin none rw,bind 0 0",
        ],
    )
    init = ct.rootfs / "sbin" / "init"
    init.write_text(BOOT_INIT)
    init.chmod(0o755)
    campaign = CampaignCt(ct, node)
    plan = campaign.host_path(PLAN)
    plan.parent.mkdir(parents=True)
    plan.write_text(plan_text())
    seed_mirror(campaign.host_path(MIRROR), model_dir, work)
    return campaign


def install_unit(campaign: CampaignCt, device: str) -> None:
    """Run ``gpudoctor service install PLAN --out OUT --device DEVICE`` INSIDE the running
    CT, as its admin would (the wrapper then waits for ``check --only device``)."""
    installed = campaign.ct.gpudoctor(
        "service", "install", PLAN, "--out", OUT, "--device", device,
        "--only", "device", "--backoff", "1:4",
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr


def make_campaign_ct(lab: Lab, model_dir: Path, work: Path, allow: list[str]) -> CampaignCt:
    """Return a stopped plain-LXC campaign CT with its own stand-in GPU bind-mounted as
    /dev/fakegpu (misc 10:232) and the unit installed (by a first, short start)."""
    name = lab.unique_name("ops")
    node = lab.make_node(f"{name}-gpu", lab.fake_gpu_major, lab.fake_gpu_minor)
    campaign = prepare_campaign_ct(lab, model_dir, work, node, name,
                                   {"/dev/fakegpu": str(node)}, tuple(allow))  # fmt: skip
    campaign.ct.start()
    install_unit(campaign, "/dev/fakegpu")
    campaign.ct.stop()
    return campaign
