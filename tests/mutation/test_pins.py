"""tests/mutation/pins.py: a listed equivalent counts only while its name means its mutation."""

from __future__ import annotations

from pathlib import Path

from tests.mutation import pins

NOW = {
    "gpudoctor.pkg.mod.x_f__mutmut_1": "-x = 1\n+x = None",
    "gpudoctor.pkg.mod.x_f__mutmut_2": "-return a\n+return b",  # was mutant 1's number before
    "gpudoctor.pkg.mod.x_g__mutmut_2": "-return a\n+return b",  # same text, other function
    "gpudoctor.pkg.mod.xǁKǁm__mutmut_3": "-y = 2\n+y = 3",
}


def test_a_pin_that_matches_keeps_the_entry() -> None:
    pinned = {"gpudoctor.pkg.mod.xǁKǁm__mutmut_3": "-y = 2\n+y = 3"}
    assert pins.stale(list(pinned), pinned, NOW) == {}


def test_a_renumbered_mutant_is_stale_and_names_where_its_mutation_went() -> None:
    pinned = {"gpudoctor.pkg.mod.x_f__mutmut_1": "-return a\n+return b"}
    assert pins.stale(list(pinned), pinned, NOW) == {
        "gpudoctor.pkg.mod.x_f__mutmut_1": "its mutation is now gpudoctor.pkg.mod.x_f__mutmut_2"
    }


def test_a_mutation_the_code_lost_and_an_unpinned_name_are_stale() -> None:
    pinned = {"gpudoctor.pkg.mod.x_f__mutmut_9": "-z = 0\n+z = 1"}
    found = pins.stale(["gpudoctor.pkg.mod.x_f__mutmut_9", "gpudoctor.pkg.mod.x_h__mutmut_1"],
                       pinned, NOW)  # fmt: skip
    assert found == {
        "gpudoctor.pkg.mod.x_f__mutmut_9": "its mutation is gone (the code changed)",
        "gpudoctor.pkg.mod.x_h__mutmut_1": "not pinned (python tests/mutation/pins.py --write)",
    }


def test_the_source_file_of_a_function_and_of_a_method() -> None:
    assert pins.source_of("gpudoctor.pve.uvm_unit.x_run__mutmut_4") == "gpudoctor/pve/uvm_unit.py"
    assert pins.source_of("gpudoctor.bench.launch.server.xǁServerProcessǁstop__mutmut_2") == (
        "gpudoctor/bench/launch/server.py"
    )


def test_pins_round_trip_through_their_toml(tmp_path: Path) -> None:
    written = {
        "gpudoctor.a.xǁKǁm__mutmut_1": '-s = "x\\\\y"\n+s = None',
        "gpudoctor.a.x_f__mutmut_2": "-a\n+b",
    }
    pins.write_pins(written, tmp_path / "pins.toml")
    assert pins.load_pins(tmp_path / "pins.toml") == written


def test_every_equivalent_has_a_pin() -> None:
    from tests.mutation.run import load_equivalent

    listed = {n for n in load_equivalent(pins.HERE / "equivalent.toml") if not n.startswith("own:")}
    assert listed == set(pins.load_pins())  # tests/mutation/pins.py --write pins new entries
