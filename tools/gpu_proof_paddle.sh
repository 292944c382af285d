#!/usr/bin/env bash
# The Paddle half of the GPU proof, in one device call, after the kit was copied to /tmp/pdc
# (../shared/tools/paddle-gpu-kit/README.md). Usage: bash tools/gpu_proof_paddle.sh "$OUT"
set -u
out=${1:?usage: gpu_proof_paddle.sh OUTDIR}
log="$out/proof-paddle.log"
# the results' tag names the card they ran on (a call for an H200 may run on an H100)
tag=${GRAPHJIT_TAG:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -o 'H[0-9]00' | tr H h)}
tag=${tag:-gpu}
{
  bash /tmp/pdc/device-setup.sh 2>&1 | grep -v '^[WI][0-9]' | tail -2
  . /tmp/pdc/env.sh
  export PYTHONUNBUFFERED=1 PYTHONPATH=.:$PYTHONPATH MIN_GRAPH_SIZE=0
  echo "== $(date -u +%FT%TZ) paddle GPU tests"
  timeout 420 $PY311 tools/gpu_tests.py -m "gpu and paddle" -j 3 --python $PY311 2>&1 | grep -v '^[WI][0-9]' | tail -80
  echo "== doctor (paddle)"
  timeout 150 $PY311 -m graphjit doctor --framework paddle 2>&1 | grep -v '^[WI][0-9]' | tail -30
  echo "== bench decode (paddle; timings only, numerics unverified on Hopper with 2.6.2)"
  timeout 240 $PY311 -m graphjit bench decode --backend paddle --iters 50 --repeats 3 --out "$out" --tag "$tag" --hard-exit \
    2>&1 | grep -v '^[WI][0-9]' | tail -25
  echo "== host profile (paddle): where a replayed call's host time goes"
  # (its two cProfile tables go to their own log: this one's tail keeps the tests, doctor and bench above)
  timeout 120 $PY311 tools/probes/host_profile_paddle.py --out "$out" > "$out/host_profile_paddle.log" 2>&1
  echo "rc=$?"; grep -v '^[WI][0-9]' "$out/host_profile_paddle.log" | tail -32
} > "$log" 2>&1
tail -140 "$log"
