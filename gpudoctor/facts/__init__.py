"""Facts: pure parsers of what a host says (``/proc/devices``, the driver version, the
GPU probe's output), plus the few readers that fetch them through a Host."""
