"""Starting, stopping and restarting a CT, and saying why a start failed: the controllers
run real processes through a real LocalHost, with shell scripts standing for LXC's
``lxc-info``/``lxc-start``/``lxc-stop`` and Proxmox's ``pct`` (the lab drives real
containers with the real tools: ``test_hooks_lab.py``, ``test_fix_lab.py``). Each stand-in
appends its argv to ``calls`` and answers from files the test writes (``state``, ``pid``,
``rc.<tool>``, ``rc.pct.<action>``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpudoctor.hosts.local import LocalHost
from gpudoctor.pve.apply import ApplyError, Layout, Target
from gpudoctor.pve.restart import LxcController, PctController, controller_for

HOOK_LOG = (
    "lxc-start gpu1 2026 DEBUG    conf - ../src/lxc/conf.c:run_buffer:311 - Script exec /h/a.sh"
    " gpu1 lxc autodev produced output: mknod: /dev/nvidia-uvm: File exists\n"
    "lxc-start gpu1 2026 ERROR    conf - ../src/lxc/conf.c:run_buffer:322 - Script exited "
    "with status 1\n"
    "lxc-start gpu1 2026 ERROR    lxc_start - ../src/lxc/tools/lxc_start.c:main:306 - The "
    "container failed to start\n"
)
WHY = ("hook /h/a.sh: mknod: /dev/nvidia-uvm: File exists",
       "ERROR conf.c:run_buffer: Script exited with status 1")  # fmt: skip

TOOL = """#!/bin/sh
d="{dir}"
echo "$(basename "$0") $*" >> "$d/calls"
tool=$(basename "$0")
case "$tool $*" in
  "lxc-info "*" -s -H") cat "$d/state" ;;
  "lxc-info "*" -p -H") cat "$d/pid" ;;
  "pct status "*) echo "status: $(tr A-Z a-z < "$d/state")" ;;
  *"-l DEBUG -o "*) shift $(($# - 1)); cat "$d/log" > "$1"; exit 1 ;;
  "pct start "*" --debug") cat "$d/log"; echo "startup for container failed" >&2; exit 1 ;;
esac
rc=$(cat "$d/rc.$tool.$1" 2>/dev/null || cat "$d/rc.$tool" 2>/dev/null || echo 0)
[ "$rc" = 0 ] || echo "$tool: failed ($rc)" >&2
exit "$rc"
"""


@pytest.fixture
def tools(tmp_path: Path, monkeypatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("lxc-info", "lxc-start", "lxc-stop", "pct"):
        (bin_dir / name).write_text(TOOL.format(dir=tmp_path))
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    (tmp_path / "state").write_text("RUNNING\n")
    (tmp_path / "pid").write_text("4242\n")
    (tmp_path / "log").write_text(HOOK_LOG)
    return tmp_path


def calls(d: Path) -> list[str]:
    return (d / "calls").read_text().splitlines() if (d / "calls").exists() else []


def lxc(d: Path, lxcpath: str | None = "/srv/lxc") -> LxcController:
    return LxcController(LocalHost(), Target("lxc", "gpu1", "c", "l"), Layout(lxcpath=lxcpath))


def pct(d: Path) -> PctController:
    return PctController(LocalHost(), Target("pve", "101", "c", "l", "pve1"),
                         Layout(pct=str(d / "bin" / "pct")))  # fmt: skip


def test_lxc_state_and_init_pid_are_read_with_lxc_info(tools) -> None:
    ctl = lxc(tools)
    assert (ctl.state(), ctl.init_pid()) == ("RUNNING", 4242)
    assert calls(tools) == [
        "lxc-info -n gpu1 -P /srv/lxc -s -H",
        "lxc-info -n gpu1 -P /srv/lxc -p -H",
    ]
    (tools / "pid").write_text("")  # stopped: no PID
    assert lxc(tools, None).init_pid() is None
    assert calls(tools)[-1] == "lxc-info -n gpu1 -p -H"  # LXC's default lxcpath: no -P
    (tools / "rc.lxc-info").write_text("1")
    assert lxc(tools).state() == "STOPPED"  # lxc-info fails for a CT that is not there


def test_a_restart_waits_for_a_new_init_pid(tools) -> None:
    ctl = lxc(tools)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:  # the CT comes up while the caller waits
        sleeps.append(seconds)
        (tools / "pid").write_text("5151\n")

    assert ctl.wait_running(4242, timeout=60, sleep=sleep) == 5151
    assert sleeps == [0.5]
    (tools / "state").write_text("STOPPED\n")
    with pytest.raises(ApplyError) as info:
        ctl.wait_running(4242, timeout=0)
    assert (info.value.code, str(info.value)) == (
        "start_failed", "CT gpu1 is not running 0 s after the restart")  # fmt: skip


def test_lxc_restart_stops_then_starts(tools) -> None:
    lxc(tools).restart()
    assert calls(tools) == [
        "lxc-stop -n gpu1 -P /srv/lxc -t 20",
        "lxc-start -n gpu1 -P /srv/lxc -d",
    ]


def test_a_failed_lxc_start_says_why_from_a_debug_start_and_leaves_no_log(tools) -> None:
    (tools / "rc.lxc-start").write_text("1")
    (tools / "state").write_text("STOPPED\n")
    with pytest.raises(ApplyError) as info:
        lxc(tools).start()
    assert info.value.code == "start_failed"
    assert str(info.value) == f"lxc-start gpu1 failed: {'; '.join(WHY)}"
    assert info.value.details == WHY
    debug = [c for c in calls(tools) if "-l DEBUG" in c]
    assert len(debug) == 1 and debug[0].startswith("lxc-start -n gpu1 -P /srv/lxc -d -l DEBUG -o ")
    log = debug[0].rsplit(" ", 1)[1]
    assert log.startswith("/tmp/gpudoctor-lxc-start.") and not Path(log).exists()


def test_a_failed_start_of_a_ct_that_runs_anyway_gives_the_commands_error(tools) -> None:
    (tools / "rc.lxc-start").write_text("1")  # state stays RUNNING: no debug start
    with pytest.raises(ApplyError) as info:
        lxc(tools).start()
    assert str(info.value) == "lxc-start gpu1 failed: lxc-start: failed (1)"
    assert info.value.details == () and not [c for c in calls(tools) if "DEBUG" in c]


def test_a_failed_stop_is_an_error_only_while_the_ct_still_runs(tools) -> None:
    (tools / "rc.lxc-stop").write_text("2")
    with pytest.raises(ApplyError) as info:
        lxc(tools).stop()
    assert (info.value.code, str(info.value)) == (
        "stop_failed",
        "lxc-stop gpu1 failed: lxc-stop: failed (2)",
    )
    (tools / "state").write_text("STOPPED\n")
    lxc(tools).stop()  # it stopped all the same: nothing to report


def test_pct_drives_a_proxmox_ct(tools) -> None:
    ctl = pct(tools)
    assert ctl.state() == "RUNNING"
    ctl.start()
    ctl.stop()
    ctl.restart()
    assert calls(tools) == ["pct status 101", "pct start 101", "pct stop 101", "pct reboot 101"]
    (tools / "rc.pct").write_text("3")
    with pytest.raises(ApplyError) as status:
        ctl.state()
    assert (status.value.code, str(status.value)) == (
        "io",
        "pct status 101 failed: pct: failed (3)",
    )
    with pytest.raises(ApplyError) as stop:
        ctl.stop()
    assert (stop.value.code, str(stop.value)) == (
        "stop_failed",
        "pct stop 101 failed: pct: failed (3)",
    )


def test_a_failed_pct_start_or_reboot_says_why_from_pct_start_debug(tools) -> None:
    (tools / "rc.pct.start").write_text("1")
    (tools / "rc.pct.reboot").write_text("1")
    (tools / "state").write_text("STOPPED\n")
    for action, run in (("pct start", pct(tools).start), ("pct reboot", pct(tools).restart)):
        with pytest.raises(ApplyError) as info:
            run()
        assert info.value.code == "start_failed"
        assert str(info.value) == f"{action} 101 failed: {'; '.join(WHY)}"
        assert info.value.details == WHY
    assert calls(tools).count("pct start 101 --debug") == 2
    (tools / "rc.pct.status").write_text("1")  # the state cannot be read: the command's error
    with pytest.raises(ApplyError) as info:
        pct(tools).start()
    assert str(info.value) == "pct start 101 failed: pct: failed (1)" and info.value.details == ()


def test_the_flavor_picks_the_controller_of_that_host_ct_and_layout() -> None:
    host, layout = LocalHost(), Layout(lxcpath="/srv/lxc")
    for flavor, kind in (("pve", PctController), ("lxc", LxcController)):
        target = Target(flavor, "101", "c", "l")
        ctl = controller_for(host, target, layout)
        assert type(ctl) is kind
        assert (ctl.host, ctl.target, ctl.layout) == (host, target, layout)


def test_a_mktemp_answer_outside_its_pattern_is_never_used_as_the_log(tools) -> None:
    evil = tools / "evil"
    (tools / "bin" / "mktemp").write_text(f"#!/bin/sh\necho {evil}\n")
    (tools / "bin" / "mktemp").chmod(0o755)
    (tools / "rc.lxc-start").write_text("1")
    (tools / "state").write_text("STOPPED\n")
    with pytest.raises(ApplyError) as info:
        lxc(tools).start()
    assert str(info.value) == "lxc-start gpu1 failed: lxc-start: failed (1)"
    assert not evil.exists() and not [c for c in calls(tools) if "DEBUG" in c]


class TimedHost(LocalHost):
    """A LocalHost that notes the deadline each command was given (``host.run(timeout=)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.deadlines: list[tuple[str, float]] = []

    def run(self, argv, timeout: float = 30.0, input: str | None = None):  # type: ignore[no-untyped-def]
        self.deadlines.append((f"{Path(argv[0]).name} {argv[1]}", timeout))
        return super().run(argv, timeout, input)


def test_every_command_has_a_deadline_so_a_hung_tool_cannot_hold_the_fix(tools) -> None:
    (tools / "rc.lxc-start").write_text("1")
    (tools / "state").write_text("STOPPED\n")
    host = TimedHost()
    ctl = LxcController(host, Target("lxc", "gpu1", "c", "l"), Layout())
    ctl.init_pid()
    ctl.stop()
    with pytest.raises(ApplyError):
        ctl.start()  # lxc-start, lxc-info, mktemp, the debug lxc-start, rm
    (tools / "rc.pct.start").write_text("1")
    p = PctController(host, Target("pve", "101", "c", "l"), Layout(pct=str(tools / "bin" / "pct")))
    p.stop()
    p.restart()
    with pytest.raises(ApplyError):
        p.start()  # pct start, pct status, pct start --debug
    assert host.deadlines == [
        ("lxc-info -n", 20), ("lxc-stop -n", 60), ("lxc-start -n", 60), ("lxc-info -n", 20),
        ("mktemp /tmp/gpudoctor-lxc-start.XXXXXX", 20), ("lxc-start -n", 60), ("rm -f", 20),
        ("pct stop", 60), ("pct reboot", 120), ("pct start", 60), ("pct status", 20),
        ("pct start", 60),
    ]  # fmt: skip
