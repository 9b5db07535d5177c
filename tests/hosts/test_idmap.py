"""The uid map read inside a target: privileged (the initial namespace) or unprivileged."""

from __future__ import annotations

from gpudoctor.facts.idmap import parse_idmap


def test_initial_namespace_is_privileged() -> None:
    idmap = parse_idmap("         0          0 4294967295\n", "65534\n")
    assert not idmap.unprivileged
    assert not idmap.unmapped_owner(65534, 65534)  # a real nobody-owned node on a host
    assert idmap.root_outside == 0


def test_unprivileged_ct_maps_root_to_100000() -> None:
    idmap = parse_idmap("         0     100000      65536\n", "65534\n")
    assert idmap.unprivileged
    assert idmap.root_outside == 100000
    assert idmap.unmapped_owner(65534, 65534)
    assert not idmap.unmapped_owner(0, 44)  # an owner mapped into the CT
    assert idmap.describe() == "uid_map 0 100000 65536"


def test_unreadable_map_counts_as_the_initial_namespace() -> None:
    idmap = parse_idmap(None, None)
    assert not idmap.unprivileged
    assert idmap.overflow_uid == 65534
