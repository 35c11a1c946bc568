#!/usr/bin/env bash
# The GPU checks of opbridge's CUDA ops on a machine with an NVIDIA GPU, a CUDA build of torch (>= 2.10) with
# torchvision and pytest-xdist, and (to build opbridge there, unless OPBRIDGE_WHEELS says otherwise, below) nvcc,
# scikit-build-core and pybind11; no network needed. Builds opbridge there, runs tests/test_cuda.py, the CUDA
# cases of tests/test_mixed_precision.py and the GPU benchmarks (python -m opbridge.tools.bench_cuda).
#
# With onnxruntime-gpu importable and OPBRIDGE_ORT_LIBRARY pointing at a libopbridge_ort.so that has
# libopbridge_ort_cuda.so beside it (`cmake -S . -B build/gpu-ort -DOPBRIDGE_BUILD_TORCH=OFF`, built anywhere nvcc
# is), it also runs tests/test_ort_cuda.py and the ORT rows of the benchmarks.
#
# With OPBRIDGE_WHEELS naming a folder of wheels built elsewhere (`nox -s "wheels(target='stable')"` and
# `"wheels(target='runtime')"`: the device's time is too scarce to build there), it installs opbridge and
# opbridge_ort from them into a temporary folder instead of building, and runs the same checks on those wheels.
#
#   [OPBRIDGE_WHEELS=dist] bash tests/run_on_gpu.sh [output directory]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "${1:-$root/reports/gpu}"
out="$(cd "${1:-$root/reports/gpu}" && pwd)"
cd "$root"
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
nvidia-smi -L || true
"$python" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
if [[ -n "${OPBRIDGE_WHEELS:-}" ]]; then
  # The wheels users install: pip picks the one for this Python; opbridge_ort's library and its CUDA library come
  # from the runtime wheel. Its one native dependency, scipy-openblas32, comes from the folder where its wheel is
  # there (no index is asked), else it must already be installed.
  site=$(mktemp -d)
  start=$(date +%s)
  packages=(opbridge opbridge_ort)
  if compgen -G "$OPBRIDGE_WHEELS/scipy_openblas32-*.whl" > /dev/null; then packages+=(scipy-openblas32); fi
  "$python" -m pip install --no-index --no-deps -q --target "$site" --find-links "$OPBRIDGE_WHEELS" "${packages[@]}"
  echo "install: $(( $(date +%s) - start )) s"
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
else
  # opbridge with its CUDA library (required here), built for this machine's torch, Python and GPU (machine code
  # for its architecture alone: half the compile time of the default's two).
  arch=$("$python" -c "import torch; print('%d%d' % torch.cuda.get_device_capability())")
  start=$(date +%s)
  "$python" -m pip install --no-build-isolation --no-deps --no-index -q \
    --config-settings=cmake.define.OPBRIDGE_BUILD_CUDA=ON --config-settings=cmake.define.OPBRIDGE_CUDA_ARCHITECTURES="$arch" \
    --config-settings=build-dir=build/gpu . 2>&1 | tail -30
  echo "build: $(( $(date +%s) - start )) s"
  # opbridge_ort's Python helpers (torch-free; the ORT library itself comes from OPBRIDGE_ORT_LIBRARY, if set).
  runtime=$(mktemp -d)
  ln -s "$root/python/opbridge_ort" "$runtime/opbridge_ort"
  export PYTHONPATH="$runtime${PYTHONPATH:+:$PYTHONPATH}"
fi
"$python" -c "import torch, opbridge, opbridge_ort
print('opbridge', opbridge.__file__)
print('CUDA kernels registered:', torch._C._dispatch_has_kernel_for_dispatch_key('opbridge::ms_deform_attn', 'CUDA'))
print('opbridge_ort CUDA library:', opbridge_ort.cuda_library_path())"
cd tests
status=0
"$python" -m pytest test_cuda.py test_ort_cuda.py -q -p no:cacheprovider -p no:benchmark -n "${PYTEST_WORKERS:-4}" -rs --junitxml="$out/test_cuda.xml" 2>&1 \
  | tee "$out/test_cuda.log" | tail -40 || status=$?
# The half-precision and autocast checks on CUDA (the same tests as on the CPU, their "cuda" cases).
"$python" -m pytest test_mixed_precision.py -k cuda -q -p no:cacheprovider -p no:benchmark -n "${PYTEST_WORKERS:-4}" -rs \
  --junitxml="$out/test_mixed_precision.xml" 2>&1 | tee "$out/test_mixed_precision.log" | tail -20 || status=$?
cd "$root"
"$python" -m opbridge.tools.bench_cuda --json "$out/bench_cuda.json" --markdown "$out/bench_cuda.md"
exit "$status"
