"""Sample NVML with GpuSampler while the GPU idles 1 s, then during 4 s of bf16 matmuls.

Prints both summaries and writes them to $OUT/telemetry_h200.json (the lent machine's
output folder) or /tmp. Needs torch with CUDA and nvidia-ml-py.
Usage: python benchmarks/telemetry_on_gpu.py
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpudoctor.bench.load.telemetry import GpuSampler


def main() -> None:
    out: dict = {}
    with GpuSampler(interval_s=0.1) as sampler:
        time.sleep(1.0)
    out["idle"] = sampler.summary()
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    with GpuSampler(interval_s=0.1) as sampler:
        t0 = time.time()
        while time.time() - t0 < 4:
            for _ in range(20):
                a = (a @ a).clamp_(-1, 1)
            torch.cuda.synchronize()
    out["busy"] = sampler.summary()
    print(json.dumps(out, indent=1))
    Path(os.environ.get("OUT", "/tmp"), "telemetry_h200.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
