#!/usr/bin/env bash
# The GPU checks of opbridge's CUDA ops on a machine with an NVIDIA GPU, a CUDA build of torch (>= 2.10) with
# torchvision, nvcc, and scikit-build-core + pybind11 (no network needed): builds opbridge there, runs
# tests/test_cuda.py, the CUDA cases of tests/test_mixed_precision.py and the GPU benchmarks
# (python -m opbridge.tools.bench_cuda).
#
# With onnxruntime-gpu importable and OPBRIDGE_ORT_LIBRARY pointing at a libopbridge_ort.so that has
# libopbridge_ort_cuda.so beside it (`cmake -S . -B build/gpu-ort -DOPBRIDGE_BUILD_TORCH=OFF`, built anywhere nvcc
# is), it also runs tests/test_ort_cuda.py and the ORT rows of the benchmarks.
#
#   bash tests/run_on_gpu.sh [output directory]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "${1:-$root/reports/gpu}"
out="$(cd "${1:-$root/reports/gpu}" && pwd)"
cd "$root"
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
nvidia-smi -L || true
"$python" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name())"
# opbridge with its CUDA library (required here), built for this machine's torch, Python and GPU (machine code for
# its architecture alone: half the compile time of the default's two).
arch=$("$python" -c "import torch; print('%d%d' % torch.cuda.get_device_capability())")
start=$(date +%s)
"$python" -m pip install --no-build-isolation --no-deps --no-index -q \
  --config-settings=cmake.define.OPBRIDGE_BUILD_CUDA=ON --config-settings=cmake.define.OPBRIDGE_CUDA_ARCHITECTURES="$arch" \
  --config-settings=build-dir=build/gpu . 2>&1 | tail -30
echo "build: $(( $(date +%s) - start )) s"
# opbridge_ort's Python helpers (torch-free; the ORT library itself is not needed by these checks).
runtime=$(mktemp -d)
ln -s "$root/python/opbridge_ort" "$runtime/opbridge_ort"
export PYTHONPATH="$runtime${PYTHONPATH:+:$PYTHONPATH}"
cd tests
status=0
"$python" -m pytest test_cuda.py test_ort_cuda.py -q -p no:cacheprovider -p no:benchmark -n 4 -rs --junitxml="$out/test_cuda.xml" 2>&1 \
  | tee "$out/test_cuda.log" | tail -40 || status=$?
# The half-precision and autocast checks on CUDA (the same tests as on the CPU, their "cuda" cases).
"$python" -m pytest test_mixed_precision.py -k cuda -q -p no:cacheprovider -p no:benchmark -n 4 -rs \
  --junitxml="$out/test_mixed_precision.xml" 2>&1 | tee "$out/test_mixed_precision.log" | tail -20 || status=$?
cd "$root"
"$python" -m opbridge.tools.bench_cuda --json "$out/bench_cuda.json" --markdown "$out/bench_cuda.md"
exit "$status"
