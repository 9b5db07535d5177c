"""Why a CT did not start, in the few lines of LXC's debug start log that say it: a log
as ``lxc-start -l DEBUG -o FILE`` writes it (LXC 5/6, ``log.c``: ``PREFIX NAME TIME
LEVEL CATEGORY - FILE:FUNCTION:LINE - MESSAGE``) and as ``pct start VMID --debug`` prints
it (no prefix). The real restart path is run against real containers in
``test_hooks_lab.py``; these pin the selection itself."""

from __future__ import annotations

from gpudoctor.pve.startlog import MAX_LINES, why_lines

HOOK = "/usr/share/lxc/hooks/nvidia-autodev.sh"
LOG = f"""\
lxc-start 101 20261204201530.101 INFO     confile - ../src/lxc/confile.c:set_config_idmaps:2273 - Read uid map: type u nsid 0 hostid 100000 range 65536
lxc-start 101 20261204201530.102 DEBUG    conf - ../src/lxc/conf.c:run_buffer:311 - Script exec {HOOK} 101 lxc autodev produced output: mknod: /usr/lib/x86_64-linux-gnu/lxc/rootfs/dev/nvidia-uvm: File exists
lxc-start 101 20261204201530.103 ERROR    conf - ../src/lxc/conf.c:run_buffer:322 - Script exited with status 1
lxc-start 101 20261204201530.104 ERROR    conf - ../src/lxc/conf.c:lxc_setup:4437 - Failed to run autodev hooks
lxc-start 101 20261204201530.105 ERROR    start - ../src/lxc/start.c:do_start:1272 - Failed to setup container "101"
lxc-start 101 20261204201530.106 ERROR    sync - ../src/lxc/sync.c:sync_wait:34 - An error occurred in another process (expected sequence number 4)
lxc-start 101 20261204201530.107 WARN     network - ../src/lxc/network.c:lxc_delete_network_priv:3631 - Failed to rename interface with index 0 from "eth0" to its initial name "veth101i0"
lxc-start 101 20261204201530.108 ERROR    lxccontainer - ../src/lxc/lxccontainer.c:wait_on_daemonized_start:878 - Received container state "ABORTING" instead of "RUNNING"
lxc-start 101 20261204201530.109 ERROR    start - ../src/lxc/start.c:__lxc_start:2107 - Failed to spawn container "101"
lxc-start 101 20261204201530.110 ERROR    lxc_start - ../src/lxc/tools/lxc_start.c:lxc_start_main:306 - The container failed to start
lxc-start 101 20261204201530.111 ERROR    lxc_start - ../src/lxc/tools/lxc_start.c:lxc_start_main:309 - To get more details, run the container in foreground mode
lxc-start 101 20261204201530.112 ERROR    lxc_start - ../src/lxc/tools/lxc_start.c:lxc_start_main:311 - Additional information can be obtained by setting the --logfile and --logpriority options
lxc-start 101 20261204201530.113 ERROR    start - ../src/lxc/start.c:lxc_abort:1039 - Failed to send SIGKILL via pidfd 17 for process 4242
"""


def test_the_hooks_output_and_the_errors_are_kept_in_log_order() -> None:
    assert why_lines(LOG) == (
        f"hook {HOOK}: mknod: /usr/lib/x86_64-linux-gnu/lxc/rootfs/dev/nvidia-uvm: File exists",
        "ERROR conf.c:run_buffer: Script exited with status 1",
        "ERROR conf.c:lxc_setup: Failed to run autodev hooks",
        'ERROR start.c:do_start: Failed to setup container "101"',
    )  # LXC's closing boilerplate (another process, spawn, state, SIGKILL, ...) dropped


def test_pct_start_debug_lines_without_a_prefix_are_read_too() -> None:
    log = (
        "DEBUG    conf - ../src/lxc/conf.c:run_buffer:311 - Script exec /usr/share/lxc/hooks/"
        "lxc-pve-prestart-hook 101 lxc pre-start produced output:   unable to parse value of"
        " 'dev0' - invalid format   \n"
        "ERROR    conf - conf.c:run_buffer:322 - Script exited with status 255  \n"
        "run_buffer: 322 Script exited with status 255\n"  # pct's own summary: not LXC's log
        "startup for container '101' failed\n"
    )
    assert why_lines(log) == (
        "hook /usr/share/lxc/hooks/lxc-pve-prestart-hook: unable to parse value of 'dev0' - "
        "invalid format",
        "ERROR conf.c:run_buffer: Script exited with status 255",
    )


def test_each_cause_is_said_once_and_at_most_the_limit() -> None:
    errors = "".join(
        f"lxc-start 101 2026 ERROR    conf - ../src/lxc/conf.c:step{n}:1 - Failed step {n}\n"
        for n in range(MAX_LINES + 3)
    )
    twice = LOG + LOG
    assert why_lines(twice) == why_lines(LOG)
    assert len(why_lines(errors)) == MAX_LINES == 8
    assert why_lines(errors)[-1] == "ERROR conf.c:step7: Failed step 7"
    assert why_lines(errors, limit=2) == (
        "ERROR conf.c:step0: Failed step 0",
        "ERROR conf.c:step1: Failed step 1",
    )


def test_other_levels_without_hook_output_say_nothing() -> None:
    log = "".join(
        f"lxc-start 101 2026 {level:<8} conf - ../src/lxc/conf.c:setup:1 - Failed something\n"
        for level in ("WARN", "NOTICE", "INFO", "DEBUG", "TRACE")
    )
    assert why_lines(log) == ()
    hook_at_info = (
        "lxc-start 101 2026 INFO     conf - ../src/lxc/conf.c:run_buffer:311 - Script exec "
        "/hooks/a 101 lxc pre-start produced output: done\n"
    )
    assert why_lines(hook_at_info) == ("hook /hooks/a: done",)
    assert why_lines("") == ()
    assert why_lines("mknod: /dev/nvidia-uvm: File exists\n") == ()  # not an LXC log line


def test_the_where_field_is_shortened_to_file_and_function() -> None:
    log = 'lxc-start 101 2026 ERROR    cgfsng - cgroups/cgfsng.c:cgfsng_setup_limits:3100 - Failed to set "devices.allow"\n'
    assert why_lines(log) == ('ERROR cgfsng.c:cgfsng_setup_limits: Failed to set "devices.allow"',)


def test_lines_that_are_not_lxcs_are_skipped_not_an_end() -> None:
    assert why_lines("starting CT 101 with --debug\n\n" + LOG) == why_lines(LOG)
