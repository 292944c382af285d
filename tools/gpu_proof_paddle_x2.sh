#!/usr/bin/env bash
# The Paddle half of the 2-GPU proof, after the kit was copied to /tmp/pdc on an nvidia-h200-x2.
# Usage (repo root): bash tools/gpu_proof_paddle_x2.sh "$OUT"
set -u
out=${1:?usage: gpu_proof_paddle_x2.sh OUTDIR}
log="$out/proof-paddle-x2.log"
{
  bash /tmp/pdc/device-setup.sh 2>&1 | grep -v '^[WI][0-9]' | tail -2
  . /tmp/pdc/env.sh
  export PYTHONUNBUFFERED=1 PYTHONPATH=.:$PYTHONPATH MIN_GRAPH_SIZE=0 NCCL_NVLS_ENABLE=0 GJ_PADDLE_AR_OUT="$out/paddle-ar"
  echo "== $(date -u +%FT%TZ) tests/test_gpu_collectives_paddle.py"
  timeout 480 $PY311 -m pytest -q tests/test_gpu_collectives_paddle.py -p no:cacheprovider -rfEs --tb=short 2>&1 \
    | grep -v '^[WI][0-9]' | tail -40
  rm -rf "$out/paddle-ar/cache"
  echo "== doctor --framework paddle --collectives"
  timeout 150 $PY311 -m graphjit doctor --framework paddle --collectives --json "$out/doctor-paddle-x2.json" 2>&1 \
    | grep -v '^[WI][0-9]' | tail -25
} > "$log" 2>&1
tar czf "$out/paddle-ar.tgz" -C "$out" paddle-ar && rm -rf "$out/paddle-ar"
tail -60 "$log"
