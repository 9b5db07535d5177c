#!/bin/bash
# Run both bench benchmarks on a lent GPU machine that has python3 + torch but no network.
#
# Prepare here (this machine has the package registry), then carry build/devwheels:
#   .venv/bin/pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 --platform any -d build/devwheels \
#     transformers==5.24.0 tokenizers safetensors huggingface_hub hf-xet fsspec filelock \
#     packaging PyYAML regex tqdm typer shellingham rich markdown-it-py mdurl Pygments click \
#     annotated-doc typing_extensions accelerate psutil fastapi starlette pydantic \
#     pydantic_core annotated-types typing-inspection uvicorn h11 anyio sniffio idna openai \
#     jiter httpx2 httpcore2 truststore opentelemetry-api Jinja2 MarkupSafe httpx==0.29.0 \
#     httpcore certifi aiohttp aiohappyeyeballs aiosignal attrs frozenlist multidict \
#     propcache yarl pybase64 requests urllib3 charset-normalizer numpy pillow distro \
#     nvidia-ml-py          # (pin the versions of .venv: .venv/bin/pip freeze)
#   cp <sglang wheel>/sglang/bench_serving.py build/devwheels/
# Then: run(command="bash benchmarks/run_on_h200.sh", carry=["build/devwheels"])
# Results land in $OUT: client_overhead_h200host.json, agreement_{cuda,cpu}.json.
set -x
TORCH_SITE=$(python3 -c "import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))")
rm -rf /tmp/v && python3 -m venv /tmp/v || exit 1
PYVER=$(python3 -c "import sys; print(f'python{sys.version_info[0]}.{sys.version_info[1]}')")
echo "$TORCH_SITE" > /tmp/v/lib/$PYVER/site-packages/torch-venv.pth
/tmp/v/bin/pip install -q --no-index --no-deps build/devwheels/*.whl 2>&1 | tail -3
/tmp/v/bin/python -c "import torch, transformers, fastapi, aiohttp; print(torch.__version__, transformers.__version__)" || exit 1
/tmp/v/bin/python benchmarks/client_overhead.py --json > "$OUT/client_overhead_h200host.json"
for dev in ${DEVICES:-cuda cpu}; do
  /tmp/v/bin/python benchmarks/metrics_agreement.py --sglang-python /tmp/v/bin/python \
    --bench-serving build/devwheels/bench_serving.py --rounds "${ROUNDS:-6}" \
    --num-prompts "${N:-32}" --output-len "${OUTLEN:-64}" --concurrency "${C:-4}" \
    --server-device "$dev" --out "$OUT/agreement_$dev.json" 2>&1 | grep -v "Writing model" | tail -25
done
