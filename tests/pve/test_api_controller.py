"""``fix --api``: the CT's lifecycle driven through the Proxmox API, spoken for real (proxmoxer,
HTTPS with a self-signed certificate on 127.0.0.1) to :class:`tests.fakes.pveapi.FakePveApi`,
the stand-in for pveproxy (which cannot run here); its ``pct`` is a shell script standing
for Proxmox's ``pct`` whose actions succeed, fail, or wait on a FIFO until the test lets
them finish. The lab runs the same path against a real container (``test_fix_lab.py``)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from gpudoctor.hosts.local import LocalHost
from gpudoctor.pve.api import ApiController, ApiSettings, call, connect
from gpudoctor.pve.apply import ApplyError, Layout, Target
from tests.fakes.pveapi import FakePveApi

TOKEN = "root@pam!gd=s3cret-token"
PCT = """#!/bin/sh
# pct stand-in: `status` says running; `start` works; `stop` fails; `reboot` waits on a FIFO
case "$1" in
  status) echo "status: running" ;;
  start) [ ! -e "{fifo}.fail-start" ] || {{ echo "CT $2 hook failed" >&2; exit 1; }} ;;
  stop) echo "CT $2 is locked (backup)" >&2; exit 25 ;;
  reboot) cat "{fifo}" >/dev/null; exit 0 ;;
esac
"""


@pytest.fixture
def api(tmp_path: Path):
    conf_dir = tmp_path / "nodes" / "pve1" / "lxc"
    conf_dir.mkdir(parents=True)
    (conf_dir / "101.conf").write_text("arch: amd64\nhostname: gpu\n")
    fifo = tmp_path / "reboot.fifo"
    os.mkfifo(fifo)
    pct = tmp_path / "pct"
    pct.write_text(PCT.format(fifo=fifo))
    pct.chmod(0o755)
    local = LocalHost()
    server = FakePveApi("pve1", conf_dir, lambda argv: local.run(list(argv), 60), str(pct),
                        TOKEN, tmp_path, users={"root@pam": "pw"}).start()  # fmt: skip
    yield server, fifo
    server.stop()


def controller(server: FakePveApi, sleeps: list[float], **settings) -> ApiController:
    target = Target("pve", "101", "/etc/pve/nodes/pve1/lxc/101.conf", "/run/lock/lxc/x", "pve1")
    conn = connect(ApiSettings(server.url, verify=str(server.cert), **settings))
    return ApiController(LocalHost(), target, Layout(), conn, poll_s=0.25, sleep=sleeps.append)


def test_the_digest_and_the_state_come_from_the_api(api) -> None:
    server, _ = api
    ctl = controller(server, [], token=TOKEN)
    conf = server.conf_dir / "101.conf"
    assert ctl.digest() == hashlib.sha1(conf.read_bytes()).hexdigest()
    assert ctl.state() == "RUNNING"
    by_password = controller(server, [], user="root@pam", password="pw")
    assert by_password.state() == "RUNNING"


def test_a_start_waits_for_its_task_and_a_failed_stop_says_why(api) -> None:
    server, _ = api
    sleeps: list[float] = []
    ctl = controller(server, sleeps, token=TOKEN)
    ctl.start()
    assert ("POST", "/api2/json/nodes/pve1/lxc/101/status/start") in server.requests
    assert all(s == 0.25 for s in sleeps)  # polled at the controller's pace
    with pytest.raises(ApplyError) as info:
        ctl.stop()
    assert info.value.code == "stop_failed"
    assert str(info.value).startswith("stop task UPID:pve1:")
    assert str(info.value).endswith(
        " ended with: command 'pct' failed: exit code 25: CT 101 is locked (backup)"
    )


def test_a_task_still_running_at_the_deadline_is_a_start_failure(api) -> None:
    server, fifo = api
    ctl = controller(server, [], token=TOKEN)
    upid = call("reboot", lambda: ctl._ct().status("reboot").post())
    try:
        with pytest.raises(ApplyError) as info:
            ctl.wait_task(str(upid), 0, "reboot")  # the FIFO holds the task: still running
        assert info.value.code == "start_failed"
        assert str(info.value) == f"reboot task {upid} still running after 0 s"
    finally:
        with open(fifo, "w") as release:
            release.write("go\n")
    sleeps: list[float] = []
    done = controller(server, sleeps, token=TOKEN)
    done.wait_task(str(upid), 60, "reboot")  # released: it stops, OK
    # each poll before the end slept once; the last poll found it stopped
    assert len(sleeps) == len([r for r in server.requests if r[1].endswith("/status")]) - 2


def test_failures_become_one_line_api_errors_naming_what_and_where(api) -> None:
    server, _ = api
    with pytest.raises(ApplyError) as untrusted:
        connect(ApiSettings(server.url, user="root@pam", password="pw"))
    assert untrusted.value.code == "api"
    assert str(untrusted.value).startswith(
        f"Proxmox API at https://127.0.0.1:{server.port}: logging in failed: its TLS "
        "certificate is not trusted"
    )
    with pytest.raises(ApplyError) as wrong:
        connect(ApiSettings(server.url, user="root@pam", password="nope", verify=str(server.cert)))
    assert str(wrong.value).startswith(
        f"Proxmox API at https://127.0.0.1:{server.port}: logging in failed: "
    )
    bad_token = controller(server, [], token="root@pam!gd=wrong")
    with pytest.raises(ApplyError) as refused:
        bad_token.state()
    assert refused.value.code == "api"
    assert str(refused.value).startswith("Proxmox API: reading the CT status failed: 401")
    with pytest.raises(ApplyError) as passed_on:
        call("x", lambda: (_ for _ in ()).throw(ApplyError("usage", "as it was")))
    assert (passed_on.value.code, str(passed_on.value)) == ("usage", "as it was")


def test_a_url_without_a_scheme_is_https_and_another_scheme_is_refused(api) -> None:
    server, _ = api
    conn = connect(ApiSettings(server.host, TOKEN, verify=str(server.cert)))
    assert str(conn.nodes("pve1").lxc("101").status.current.get()["status"]) == "running"
    for url in ("http://127.0.0.1:8006", "https://", "ftp://pve1"):
        with pytest.raises(ApplyError, match=r"expected https://HOST\[:PORT\]") as info:
            connect(ApiSettings(url, TOKEN))
        assert info.value.code == "usage"


def test_the_default_port_is_pveproxys() -> None:
    # nothing listens on 127.0.0.1:8006 here: the refused connection names that port
    ctl = ApiController(LocalHost(), Target("pve", "101", "c", "l", "pve1"), Layout(),
                        connect(ApiSettings("https://127.0.0.1", TOKEN, timeout=5)))  # fmt: skip
    if _listening(8006):
        pytest.skip("something listens on 127.0.0.1:8006 on this machine")
    with pytest.raises(ApplyError, match="8006"):
        ctl.state()


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_a_reboot_is_polled_at_the_default_pace_until_its_task_stops(api) -> None:
    server, fifo = api
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:  # the task runs until the first wait: then it may end
        sleeps.append(seconds)
        if len(sleeps) == 1:
            with open(fifo, "w") as release:
                release.write("go\n")

    target = Target("pve", "101", "c", "l", "pve1")
    conn = connect(ApiSettings(server.url, TOKEN, verify=str(server.cert)))
    ApiController(LocalHost(), target, Layout(), conn, sleep=sleep).restart()
    assert ("POST", "/api2/json/nodes/pve1/lxc/101/status/reboot") in server.requests
    assert sleeps and set(sleeps) == {0.5}


def test_the_init_pid_still_comes_from_lxc_info_on_the_host(tmp_path, monkeypatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "lxc-info").write_text(f'#!/bin/sh\necho "$*" > {tmp_path}/args\necho 4242\n')
    (bin_dir / "lxc-info").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    ctl = ApiController(LocalHost(), Target("pve", "101", "c", "l", "pve1"),
                        Layout(lxcpath="/var/lib/lxc"), api=None)  # fmt: skip
    assert ctl.init_pid() == 4242
    assert (tmp_path / "args").read_text() == "-n 101 -P /var/lib/lxc -p -H\n"


def test_each_failed_request_names_what_was_asked(api) -> None:
    server, _ = api
    target = Target("pve", "999", "c", "l", "pve1")  # no such CT on the node
    conn = connect(ApiSettings(server.url, TOKEN, verify=str(server.cert)))
    ctl = ApiController(LocalHost(), target, Layout(), conn)
    for run, what in ((ctl.digest, "reading the CT config"), (ctl.start, "start of CT 999"),
                      (ctl.state, "reading the CT status")):  # fmt: skip
        with pytest.raises(ApplyError) as info:
            run()
        assert info.value.code == "api"
        assert str(info.value).startswith(f"Proxmox API: {what} failed: 500"), str(info.value)


def test_an_untrusted_certificate_gets_advice_only_when_certificates_are_checked() -> None:
    import ssl

    def untrusted() -> None:
        raise ssl.SSLError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")

    with pytest.raises(ApplyError) as checked:
        call("logging in", untrusted)
    assert str(checked.value) == (
        "Proxmox API: logging in failed: its TLS certificate is not trusted: pass "
        "--api-ca-file with the cluster's CA (/etc/pve/pve-root-ca.pem), or --api-insecure"
    )
    with pytest.raises(ApplyError) as insecure:
        call("logging in", untrusted, insecure=True, where="https://pve1:8006")
    assert str(insecure.value).startswith(
        "Proxmox API at https://pve1:8006: logging in failed: the TLS handshake failed: "
    )


def test_usage_errors_say_what_to_pass() -> None:
    with pytest.raises(ApplyError) as token:
        connect(ApiSettings("https://pve1", "root@pam"))
    assert (token.value.code, str(token.value)) == (
        "usage", "--api-token must look like USER@REALM!TOKENID=SECRET")  # fmt: skip
    with pytest.raises(ApplyError) as nothing:
        connect(ApiSettings("https://pve1"))
    assert (nothing.value.code, str(nothing.value)) == (
        "usage", "--api needs --api-token, or --api-user and --api-password")  # fmt: skip


def test_a_failed_start_task_and_an_unknown_task_say_which(api) -> None:
    server, fifo = api
    ctl = controller(server, [], token=TOKEN)
    Path(f"{fifo}.fail-start").write_text("")
    with pytest.raises(ApplyError) as start:
        ctl.start()
    assert start.value.code == "start_failed"
    assert str(start.value).endswith(
        " ended with: command 'pct' failed: exit code 1: CT 101 hook failed"
    )
    upid = call("reboot", lambda: ctl._ct().status("reboot").post())
    try:
        with pytest.raises(ApplyError) as running:
            ctl.wait_task(str(upid), 0, "reboot")
        assert str(running.value) == f"reboot task {upid} still running after 0 s"
    finally:
        with open(fifo, "w") as release:
            release.write("go\n")
    with pytest.raises(ApplyError) as unknown:
        ctl.wait_task("UPID:pve1:nope", 60, "start")
    assert str(unknown.value).startswith("Proxmox API: polling task UPID:pve1:nope failed: 500")
