"""The gpudoctor check catalogue: one module per check family.

Every module defines checks with :func:`gpudoctor.registry.check`; the registry
imports the modules listed in ``CATALOGUE`` (plus the ``gpudoctor.checks`` entry
points) and validates each check's metadata at load time.
"""

CATALOGUE = (
    "proc",
    "driver",
    "devices",
    "cuda",
    "nvml",
    "storage",
    "multigpu",
    "allreduce",
    "ct_rules",
)
