"""gpudoctor: diagnose and fix NVIDIA GPU access in LXC/Proxmox containers."""

__version__ = "0.1.0"
