#!/usr/bin/env bash
# The 2-GPU proof of the custom all-reduce (torch), in one device call on nvidia-h200-x2.
# Usage (repo root): bash tools/gpu_proof_x2.sh "$OUT" tests   (then, in further calls: ... rest, ... bench)
# rest: the other files of `make test-gpu` (torch; test_gpu_collectives.py is in tests).
# Writes into OUT: proof-x2-*.log, the workers' JSON and logs (collectives.tgz), doctor-x2.json, the allreduce
# bench JSON + PNG and the eager host-cost probe (part bench).
set -u
out=${1:?usage: gpu_proof_x2.sh OUTDIR tests|rest|bench}
part=${2:-tests}
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
log="$out/proof-x2-$part.log"
if [ "$part" = tests ]; then
{
  echo "== $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null)"
  nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
  nvidia-smi topo -m 2>&1 | head -8
  python3 -m graphjit build 2>&1 | tail -2
  echo "== tests/test_gpu_collectives.py (2 processes, 1 GPU each, NCCL reference)"
  timeout 330 python3 -m pytest -q tests/test_gpu_collectives.py -p no:cacheprovider -rfEs --tb=short \
    --basetemp="$out/collectives" 2>&1 | tail -30
  echo "== doctor --collectives"
  timeout 120 python3 -m graphjit doctor --framework torch --collectives --json "$out/doctor-x2.json" 2>&1 | tail -30
  echo "== examples/tp_mlp.py --backend nccl"
  timeout 100 python3 examples/tp_mlp.py --backend nccl 2>&1 | tail -12
} > "$log" 2>&1
# few files come back from a device call: the workers' JSON and logs travel as one archive
rm -rf "$out"/collectives/*/cache "$out"/collectives/*current
tar czf "$out/collectives.tgz" -C "$out" collectives && rm -rf "$out/collectives"
elif [ "$part" = rest ]; then
{
  echo "== $(date -u +%FT%TZ) make test-gpu without tests/test_gpu_collectives.py"
  AR_LOCAL_OUT="$out" timeout 500 python3 -m pytest -q -m "gpu and not paddle" tests -p no:cacheprovider -rfEs \
    --tb=short --ignore=tests/test_gpu_collectives.py 2>&1 | tail -30
} > "$log" 2>&1
else
{
  python3 -m graphjit build 2>&1 | tail -1
  echo "== bench allreduce"
  timeout 420 python3 -m graphjit bench allreduce --out "$out" --tag h200x2 2>&1 | tail -40
  echo "== host time per eager call, layer by layer (tools/probes/ar_host_cost.py)"
  timeout 120 python3 tools/probes/ar_host_cost.py --out "$out/hostcost" 2>&1 | head -20
} > "$log" 2>&1
fi
tail -90 "$log"
