#!/usr/bin/env bash
# One prepared GPU check (issue 8, "GPU"): the CUDA tests, then `deferdump bench --device cuda --json`
# (full run) with its plot. Everything it produces goes to $OUT (default ./gpu-out):
#   gpu_check.log, nvidia-smi.txt, torch.txt, cuda-tests.xml, bench-cuda.json, bench-cuda.png,
#   bench-cuda-quick.json (a first, quick pass that is kept even if the full run runs out of time), and
#   bench-vllm.json / bench-vllm.png (deferdump bench --vllm --quick) where vLLM is installed.
# Usage (repository root of a checkout, on a machine with an NVIDIA GPU):
#   OUT=/some/dir tools/gpu_check.sh
# It reuses a Python whose torch already sees CUDA (venv with --system-site-packages); otherwise it installs
# torch==2.13.0 (PyPI's Linux wheel is the CUDA build; never a bare `torch`). Offline machines: set
# WHEELHOUSE=<dir of wheels> and pip installs from there only.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
echo "gpu_check: $(date -u +%Y-%m-%dT%H:%M:%SZ) in $PWD, results in $OUT"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || echo "gpu_check: nvidia-smi failed (see nvidia-smi.txt)"

PY="${PYTHON:-python3}"
VENV="${GPU_VENV:-.venv-gpu}"
PIP=(-q --disable-pip-version-check)
[ -n "${WHEELHOUSE:-}" ] && PIP+=(--no-index --find-links "$WHEELHOUSE")
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv --system-site-packages "$VENV" || { echo "gpu_check: cannot create $VENV with $PY"; exit 2; }
fi
VPY="$VENV/bin/python"
if ! "$VPY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_check: no CUDA-enabled torch yet: installing torch==2.13.0"
  "$VPY" -m pip install "${PIP[@]}" torch==2.13.0 || { echo "gpu_check: torch install failed"; exit 2; }
fi
"$VPY" -m pip install "${PIP[@]}" -e '.[test,bench]' || { echo "gpu_check: installing deferdump failed"; exit 2; }
"$VPY" - > "$OUT/torch.txt" <<'PYEOF'
import torch
assert torch.cuda.is_available(), "torch.cuda.is_available() is False"
print(torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(), torch.cuda.device_count(), "device(s)")
PYEOF
[ $? -eq 0 ] || { echo "gpu_check: CUDA is not usable from torch"; cat "$OUT/torch.txt"; exit 2; }
cat "$OUT/torch.txt"

status=0
echo "gpu_check: CUDA tests"
"$VENV/bin/pytest" -q -m cuda tests --ignore=tests/vllm -p no:cacheprovider --junitxml "$OUT/cuda-tests.xml" || status=1

echo "gpu_check: deferdump bench --quick --device cuda"
"$VENV/bin/deferdump" bench --quick --device cuda --json --no-tlc --plot "$OUT/bench-cuda-quick.png" \
  > "$OUT/bench-cuda-quick.json" || status=1
echo "gpu_check: deferdump bench --device cuda (full)"
"$VENV/bin/deferdump" bench --device cuda --json --no-tlc --plot "$OUT/bench-cuda.png" \
  > "$OUT/bench-cuda.json" || status=1
"$VPY" - "$OUT/bench-cuda.json" <<'PYEOF' || true
import json, sys
report = json.load(open(sys.argv[1]))
for key, verdict in report["goals"].items():
    print(f"{key}: {verdict['value']} (goal {verdict['goal']}, met {verdict['met']})")
PYEOF
# The connectors inside real vLLM (deferdump bench --vllm), where this machine's Python has vLLM: the device
# machine reaches no package index, so it is used only when already installed there.
if "$VPY" -c "import vllm, sys; sys.exit(0 if vllm.__version__ else 1)" 2>/dev/null; then
  echo "gpu_check: deferdump bench --vllm --quick"
  "$VENV/bin/deferdump" bench --vllm --quick --json --plot "$OUT/bench-vllm.png" > "$OUT/bench-vllm.json" || status=1
else
  echo "gpu_check: deferdump bench --vllm skipped: vLLM is not installed for $VPY"
fi
echo "gpu_check: done, status $status"
exit $status
