"""The three triggers ``--host-prep`` installs for ``fix --follow-driver``, as the files a
node gets (``test_uvm_unit.py`` installs them into a real systemd root and has
``systemd-analyze verify`` read them; these pin what each says)."""

from __future__ import annotations

from gpudoctor.pve.follow_units import (
    PATH_UNIT,
    SERVICE,
    WATCHED,
    command_line,
    path_text,
    service_text,
    udev_text,
    watched_paths,
)


def test_the_service_remakes_the_nodes_then_follows_the_driver() -> None:
    """No start limit (issue 46: any user, or a CT bind-mounting /dev/nvidia-uvm, could use
    it up by opening and closing the node, and the path unit then stops watching); a
    second's sleep first bounds such a loop to one run a second or less."""
    text = service_text("/usr/local/bin/gpudoctor", "/usr/bin/nvidia-modprobe")
    assert text == (
        "[Unit]\n"
        "Description=Follow the NVIDIA driver: the CTs' devices after a module reload (gpudoctor)\n"
        "After=pve-guests.service lxc.service gpudoctor-nvidia-uvm.service\n"
        "StartLimitIntervalSec=0\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        "EnvironmentFile=-/etc/default/gpudoctor-follow-driver\n"
        "ExecStartPre=/bin/sleep 1\n"
        "ExecStartPre=-/usr/bin/nvidia-modprobe -u -c=0\n"
        "ExecStart=/usr/local/bin/gpudoctor fix --follow-driver --if-host-changed --yes "
        "$GPUDOCTOR_FOLLOW_ARGS\n"
    )
    without = service_text("/usr/local/bin/gpudoctor", "")
    assert "ExecStartPre=-" not in without  # nvidia-modprobe not installed: nothing to remake
    assert without == text.replace("ExecStartPre=-/usr/bin/nvidia-modprobe -u -c=0\n", "")


def test_the_service_passes_on_host_preps_own_flavor_and_lxcpath() -> None:
    """Issue 47: `--host-prep --flavor lxc` planned a unit running `fix --follow-driver`
    without `--flavor lxc`, which fails on a plain LXC host ("not a Proxmox VE node")."""
    text = service_text("/g", "", ("--flavor", "lxc", "--lxcpath", "/var/lib/my lxc"))
    assert text.endswith(
        "ExecStart=/g fix --follow-driver --if-host-changed --yes --flavor lxc"
        " --lxcpath '/var/lib/my lxc' $GPUDOCTOR_FOLLOW_ARGS\n"
    )
    assert service_text("/g", "", ()) == service_text("/g", "")


def test_the_path_unit_watches_each_path_and_starts_the_service() -> None:
    """No trigger limit (issue 46: 200 events in 2 s, a user's open/close loop, made the
    path unit stop watching: "trigger-limit-hit")."""
    assert path_text(("/dev/nvidia-uvm", "/dev/fakegpu0")) == (
        "[Unit]\n"
        "Description=Watch the NVIDIA nodes whose majors move; follow the driver (gpudoctor)\n"
        "\n"
        "[Path]\n"
        "PathChanged=/dev/nvidia-uvm\n"
        "PathChanged=/dev/fakegpu0\n"
        f"Unit={SERVICE}\n"
        "TriggerLimitIntervalSec=0\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )
    assert PATH_UNIT == "gpudoctor-follow-driver.path" and SERVICE.endswith(".service")


def test_the_udev_rule_starts_the_service_when_an_nvidia_module_loads() -> None:
    assert udev_text() == (
        "# gpudoctor: re-derive the CTs' devices when an NVIDIA module is (re)loaded\n"
        'ACTION=="add", SUBSYSTEM=="module", KERNEL=="nvidia|nvidia_uvm|nvidia_modeset", '
        'RUN+="/bin/systemctl --no-block start gpudoctor-follow-driver.service"\n'
    )
    assert 'RUN+="/usr/bin/systemctl --no-block' in udev_text("/usr/bin/systemctl")


def test_a_watched_path_once_listed_stays_listed() -> None:
    old = path_text(("/dev/nvidia-uvm", "/dev/fakegpu0", "/dev/nvidia-caps"))
    old += "#PathChanged=/dev/commented\nPathExists=/dev/other\nPathChanged= /dev/spaced \n"
    old += "PathChanged=/dev/disk/by-id/usb-a=b\n"  # an = in the path: kept whole
    assert watched_paths(old, ("/dev/new", "/dev/fakegpu0")) == (
        *WATCHED, "/dev/fakegpu0", "/dev/spaced", "/dev/disk/by-id/usb-a=b", "/dev/new")  # fmt: skip
    assert watched_paths("", ()) == WATCHED == (
        "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-caps")  # fmt: skip


def test_the_command_line_quotes_each_word_that_needs_it() -> None:
    assert command_line(["/opt/my tools/python3", "-m", "gpudoctor"]) == (
        "'/opt/my tools/python3' -m gpudoctor")  # fmt: skip
    assert command_line([]) == ""
