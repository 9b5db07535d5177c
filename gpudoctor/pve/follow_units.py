"""The node's triggers for ``gpudoctor fix --follow-driver`` (installed by ``--host-prep``).

Three files, each the text of one trigger, all starting the same oneshot service:

* ``gpudoctor-follow-driver.service``: ``Type=oneshot``; first ``nvidia-modprobe -u -c=0``
  (when installed: it re-creates /dev/nvidia-uvm and nvidia-caps with the majors the new
  module got), then ``gpudoctor fix --follow-driver --yes`` (every CT of the node against
  the host's devices now: :mod:`gpudoctor.pve.follow`); its output is the unit's journal.
  ``--if-host-changed``: a trigger that finds the host's devices as the last run left them
  does nothing (a CUDA process closing /dev/nvidia-uvm, or the re-check's own open of a
  node, is a close-after-write that ``PathChanged=`` reports too: without this, each run
  would trigger the next).
  ``EnvironmentFile=-/etc/default/gpudoctor-follow-driver`` may set
  ``GPUDOCTOR_FOLLOW_ARGS`` (``--flavor lxc``, ``--lxcpath DIR``, ...). A start requested
  while it runs is merged into the running one by systemd; the command's own lock and its
  second pass (when the devices moved during the first) cover what comes later.
  ``StartLimitIntervalSec=0``: any user (the node is 0666), or a CT that bind-mounts it,
  can open and close /dev/nvidia-uvm in a loop, and every CUDA process's exit does it too:
  under systemd's default start limit (5 in 10 s) the service would be refused, and the
  path unit would then stop watching ("unit-start-limit-hit") until restarted, so a real
  reload would go unfollowed (issue 46). ``ExecStartPre=/bin/sleep 1`` keeps such a loop to
  one run a second or less (a change during the sleep is seen by the run after it).
* ``gpudoctor-follow-driver.path``: ``TriggerLimitIntervalSec=0`` for the same reason
  (the path unit's own limit, 200 activations in 2 s, counts every event, also those merged
  into a running start: hit, it stops watching, "trigger-limit-hit").
  ``PathChanged=`` on the nodes of NVIDIA's dynamic
  majors (a node re-created, removed, its attributes changed), plus any ``--device``
  given to ``--host-prep`` (a watched path once listed stays listed: a later
  ``--host-prep`` never drops it).
* ``/etc/udev/rules.d/71-gpudoctor-follow-driver.rules``: on the ``add`` uevent of the
  nvidia, nvidia_uvm and nvidia_modeset modules, ``systemctl --no-block start`` the service
  (the module (re)load itself, before anyone re-creates a node).
"""

from __future__ import annotations

import shlex

SERVICE = "gpudoctor-follow-driver.service"
PATH_UNIT = "gpudoctor-follow-driver.path"
UDEV_RULE = "etc/udev/rules.d/71-gpudoctor-follow-driver.rules"
ENV_FILE = "/etc/default/gpudoctor-follow-driver"
WATCHED = ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-caps")
"""The nodes whose majors are dynamic (nvidia-uvm, nvidia-caps): re-made after a reload."""
MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset")


def service_text(gpudoctor: str, nvidia_modprobe: str, args: tuple[str, ...] = ()) -> str:
    """Return the oneshot that follows the driver (``gpudoctor``: the command that runs
    gpudoctor on the node; ``nvidia_modprobe``: its path, "" when not installed; ``args``:
    ``--host-prep``'s own ``--flavor lxc`` / ``--lxcpath DIR``, which the node needs)."""
    pre = f"ExecStartPre=-{nvidia_modprobe} -u -c=0\n" if nvidia_modprobe else ""
    own = f"{command_line(list(args))} " if args else ""
    return (
        "[Unit]\n"
        "Description=Follow the NVIDIA driver: the CTs' devices after a module reload (gpudoctor)\n"
        "After=pve-guests.service lxc.service gpudoctor-nvidia-uvm.service\n"
        "StartLimitIntervalSec=0\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        f"EnvironmentFile=-{ENV_FILE}\n"
        "ExecStartPre=/bin/sleep 1\n"
        f"{pre}"
        f"ExecStart={gpudoctor} fix --follow-driver --if-host-changed --yes {own}$GPUDOCTOR_FOLLOW_ARGS\n"
    )


def path_text(watched: tuple[str, ...]) -> str:
    """Return the path unit that starts the service when a watched node changes."""
    lines = "".join(f"PathChanged={p}\n" for p in watched)
    return (
        "[Unit]\n"
        "Description=Watch the NVIDIA nodes whose majors move; follow the driver (gpudoctor)\n"
        "\n"
        "[Path]\n"
        f"{lines}"
        f"Unit={SERVICE}\n"
        "TriggerLimitIntervalSec=0\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def udev_text(systemctl: str = "/bin/systemctl") -> str:
    """Return the udev rule that starts the service when an NVIDIA module is loaded."""
    kernels = "|".join(MODULES)
    return (
        "# gpudoctor: re-derive the CTs' devices when an NVIDIA module is (re)loaded\n"
        f'ACTION=="add", SUBSYSTEM=="module", KERNEL=="{kernels}", '
        f'RUN+="{systemctl} --no-block start {SERVICE}"\n'
    )


def watched_paths(old_path_unit: str, extra: tuple[str, ...]) -> tuple[str, ...]:
    """Return the paths to watch: NVIDIA's moving nodes, those the installed path unit
    already watches (``PathChanged=`` lines of ``old_path_unit``), then ``extra``."""
    kept = [ln.split("=", 1)[1].strip() for ln in old_path_unit.splitlines()
            if ln.startswith("PathChanged=")]  # fmt: skip
    return tuple(dict.fromkeys([*WATCHED, *kept, *extra]))


def command_line(argv: list[str]) -> str:
    """Return ``argv`` as one ExecStart= command line (each word quoted when needed)."""
    return " ".join(shlex.quote(a) for a in argv)
