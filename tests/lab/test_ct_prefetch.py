"""The fleet's one-round-trip prefetch of a CT's facts (issue 14.5), on REAL lab CTs:
pipelined answers equal one-by-one answers (dash and busybox ash), a prefetched check run
sends nothing more to the CT and judges the same, and the snapshot ends with the host."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpudoctor.context import CheckOptions, DeviceRequest
from gpudoctor.fleet.prefetch import ct_requests, prefetch_ct
from gpudoctor.hosts.base import Host
from gpudoctor.hosts.container import ContainerHost
from gpudoctor.model import Report, Status
from gpudoctor.runner import run_checks
from tests.lab.busybox import BusyboxContainer, busybox_container
from tests.lab.fixtures import FAKE_GPU_INSIDE
from tests.lab.lxc import Lab, LabContainer

pytestmark = pytest.mark.lab
OPTIONS = CheckOptions(devices=(DeviceRequest(FAKE_GPU_INSIDE, "misc"),))


@pytest.fixture(params=["local", "ssh"])
def parent(request: pytest.FixtureRequest, lab: Lab) -> Iterator[Host]:
    """The container's host: this machine (pure-cgroup2 namespace) or the lab sshd."""
    if request.param == "local":
        yield lab.host
        return
    host = request.getfixturevalue("lab_sshd").host()
    yield host
    host.close()


@pytest.fixture
def busybox(lab: Lab) -> Iterator[BusyboxContainer]:
    """A ``lxc-create -t busybox`` CT (no python3), the stand-in GPU denied."""
    ct = busybox_container(lab, devices={FAKE_GPU_INSIDE: str(lab.fake_gpu)})
    yield ct
    ct.destroy()


def inside(parent: Host, ct: LabContainer) -> ContainerHost:
    return ContainerHost(parent, ct.name, flavor="lxc", lxcpath=ct.lxcpath, agent="sh")


def answer(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except OSError as exc:
        return ("OSError", exc.errno)


QUESTIONS: list[tuple[str, dict[str, Any]]] = [
    *ct_requests(OPTIONS, open_nodes=True),
    ("read_text", {"path": "/proc/self/uid_map", "limit": 1 << 20}),
    ("read_text", {"path": "/proc/devices", "limit": 9}),
    ("read_text", {"path": "/etc/hostname", "limit": 1 << 20}),
    ("read_text", {"path": "/nonexistent/x", "limit": 1 << 20}),
    ("stat", {"path": "/dev/null/below"}),
    ("try_open", {"path": "/dev/null", "write": True, "nodes_only": True}),
    ("try_open", {"path": "/dev/null", "write": False}),
    ("list_dir", {"path": "/etc/hostname"}),
]


VOLATILE = ("/proc/self/status", "/proc/meminfo")


def keys(text: str) -> list[str]:
    return [line.split(":")[0] for line in text.splitlines()]


@pytest.mark.parametrize("shell", ["dash", "busybox"])
def test_pipelined_answers_equal_one_by_one_answers(
    parent: Host, denied_container: LabContainer, request: pytest.FixtureRequest, shell: str
) -> None:
    """Every request sent at once (one write, answers read in order) gets the answer it
    gets alone, errors included; ``open W`` of a file that is no device node is not tried."""
    ct = denied_container if shell == "dash" else request.getfixturevalue("busybox")
    with inside(parent, ct) as host:
        conn = host._connection()
        together = conn.call_many(QUESTIONS, 30)
        for (op, args), got in zip(QUESTIONS, together, strict=True):
            alone = answer(lambda op=op, args=args: conn.call(op, dict(args), 30))
            if isinstance(got, OSError):
                got = ("OSError", got.errno)
            if args["path"] in VOLATILE:  # counters change between two reads: same keys
                got, alone = keys(got), keys(alone)
            assert got == alone, (op, args)
        skipped = conn.call_many([("try_open", {"path": "/proc/version", "nodes_only": True})], 30)
        assert skipped == [None]
        assert together[QUESTIONS.index(("stat", {"path": FAKE_GPU_INSIDE}))]["kind"] == "char"


def verdicts(report: Report) -> dict[str, Status]:
    return {r.check_id: r.status for r in report.results}


@pytest.mark.parametrize("shell", ["dash", "busybox"])
def test_prefetched_check_run_asks_nothing_more_and_judges_the_same(
    parent: Host, denied_container: LabContainer, request: pytest.FixtureRequest, shell: str
) -> None:
    """After the prefetch (at most two round trips) the whole catalogue runs without one
    more request to the CT, with the verdicts of a run without it (EPERM found)."""
    ct = denied_container if shell == "dash" else request.getfixturevalue("busybox")
    with inside(parent, ct) as plain:
        before = run_checks(plain, OPTIONS)
    with inside(parent, ct) as host:
        assert prefetch_ct(host, OPTIONS, open_nodes=True) >= len(ct_requests(OPTIONS, True))
        conn = host._connection()
        asked: list[str] = []
        real_call = conn.call
        conn.call = lambda op, args, timeout: (
            asked.append((op, args)) or real_call(op, args, timeout)
        )
        after = run_checks(host, OPTIONS)
    assert asked == [], asked
    assert verdicts(after) == verdicts(before)
    assert verdicts(after)["device.open"] == Status.FAIL
    assert "EPERM" in next(f.message for f in after.findings if f.check_id == "device.open")


def test_snapshot_ends_with_the_host(parent: Host, denied_container: LabContainer) -> None:
    """The snapshot is one run's view: a CT change after the prefetch is seen once the
    host is closed (the next call starts a fresh agent and asks again)."""
    marker = "/dev/shm/gpudoctor-prefetch-test"
    denied_container.shell(f"rm -f {marker}")
    host = inside(parent, denied_container)
    try:
        host.prefetch([("stat", {"path": marker})])
        assert answer(lambda: host.stat(marker)) == ("OSError", 2)
        assert denied_container.shell(f"touch {marker}").ok
        assert answer(lambda: host.stat(marker)) == ("OSError", 2)  # the run's snapshot
        host.close()
        assert host.stat(marker).kind == "file"
    finally:
        host.close()
        denied_container.shell(f"rm -f {marker}")
