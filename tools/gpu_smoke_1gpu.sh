#!/usr/bin/env bash
# Every command-line path on one GPU, with small configurations: the doctor's rows and probes and each
# benchmark's GPU code, after a change to the command-line tools. Results are checked by the commands
# themselves (the doctor's exit status, the benchmarks' correctness columns); timings from the small
# configurations are not results.
# Usage (repo root, torch machine python3): bash tools/gpu_smoke_1gpu.sh "$OUT"
# Paddle part (after the kit was copied to /tmp/pdc): bash tools/gpu_smoke_1gpu.sh "$OUT" paddle
set -u
out=${1:?usage: gpu_smoke_1gpu.sh OUTDIR [torch|paddle]}
part=${2:-torch}
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
log="$out/smoke-1gpu-$part.log"
if [ "$part" = torch ]; then
{
  echo "== $(date -u +%FT%TZ)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  echo "== doctor --framework torch"
  timeout 150 python3 -m graphjit doctor --framework torch --json "$out/doctor-torch.json" 2>&1 | tail -25; echo "rc ${PIPESTATUS[0]}"
  echo "== doctor --collectives (shared GPU test mode)"
  GRAPHJIT_AR_SHARED_GPU=1 timeout 200 python3 -m graphjit doctor --framework torch --collectives \
    --json "$out/doctor-collectives.json" 2>&1 | tail -12; echo "rc ${PIPESTATUS[0]}"
  echo "== bench decode (torch, small)"
  timeout 240 python3 -m graphjit bench decode --backend torch --layers 8 --batch 1 --iters 50 --repeats 3 \
    --out "$out" --tag smoke 2>&1 | tail -20; echo "rc ${PIPESTATUS[0]}"
  echo "== bench train (small)"
  timeout 200 python3 -m graphjit bench train --steps 20 --repeats 2 --out "$out" --tag smoke 2>&1 | tail -14
  echo "rc ${PIPESTATUS[0]}"
  echo "== bench dispatch"
  timeout 100 python3 -m graphjit bench dispatch --out "$out" --tag smoke 2>&1 | tail -8; echo "rc ${PIPESTATUS[0]}"
  echo "== bench allreduce --shared-gpu (smoke)"
  timeout 240 python3 -m graphjit bench allreduce --shared-gpu --sizes 4K,256K --out "$out" --tag smoke 2>&1 \
    | tail -16; echo "rc ${PIPESTATUS[0]}"
} > "$log" 2>&1
else
{
  bash /tmp/pdc/device-setup.sh 2>&1 | grep -v '^[WI][0-9]' | tail -2
  . /tmp/pdc/env.sh
  export PYTHONPATH=.:$PYTHONPATH MIN_GRAPH_SIZE=0
  echo "== doctor --framework paddle"
  timeout 200 $PY311 -m graphjit doctor --framework paddle --json "$out/doctor-paddle.json" 2>&1 \
    | grep -v '^[WI][0-9]' | tail -25; echo "rc ${PIPESTATUS[0]}"
  echo "== bench decode (paddle, small; timings and elementwise numerics meaningless on Hopper with 2.6.2)"
  timeout 240 $PY311 -m graphjit bench decode --backend paddle --layers 8 --batch 1 --iters 30 --repeats 2 \
    --out "$out" --tag smoke --hard-exit 2>&1 | grep -v '^[WI][0-9]' | tail -20; echo "rc ${PIPESTATUS[0]}"
} > "$log" 2>&1
fi
tail -150 "$log"
