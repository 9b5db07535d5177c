"""The gpudoctor check catalogue: one module per check family.

A check's module is its family: every ``gpu.*`` check lives in ``checks/gpu.py``, every
``nccl.*`` check in ``checks/nccl.py``, and so on; the registry refuses, at load, a check
whose id does not start with its module's name. ``CATALOGUE`` lists every shipped check
once, in report order (the order of ``gpudoctor check``'s report and of ``gpudoctor
list``; the runner still starts each after its dependencies). The registry imports the
module of each family listed here (plus the ``gpudoctor.checks`` entry points) and
validates each check's metadata at load time. A new check: define it with
:func:`gpudoctor.registry.check` in its family's module (a new family: a new module named
for it) and add its id here.
"""

CATALOGUE = (
    "proc.usable",
    "host.kernel_modules",
    "driver.loaded",
    "device.nodes",
    "device.open",
    "nvml.init",
    "driver.userspace_match",
    "host.xid",
    "cuda.init",
    "device.unchanged",
    "gpu.health",
    "shm.capacity",
    "model.present",
    "gpu.count",
    "nccl.p2p",
    "nccl.allreduce",
    "ct.device_rules",
    "ct.hooks",
    "driver.libs_mode",
)
