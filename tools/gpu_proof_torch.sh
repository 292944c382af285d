#!/usr/bin/env bash
# The torch half of the GPU proof, in one device call: tests, doctor, benchmarks.
# Usage on the GPU machine (repo root): bash tools/gpu_proof_torch.sh "$OUT"
# Writes into OUT: proof-torch.log (everything printed), test-logs.tgz (each test file's whole log), and the
# benchmarks' JSON and PNG files.
set -u
out=${1:?usage: gpu_proof_torch.sh OUTDIR}
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
log="$out/proof-torch.log"
{
  echo "== $(date -u +%FT%TZ) commit $(cat .git/HEAD 2>/dev/null) $(git rev-parse --short HEAD 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  echo "== make test-gpu (torch)"
  timeout 420 python3 tools/gpu_tests.py -m "gpu and not paddle" -j 4 --logs /tmp/graphjit-gpu-logs 2>&1 | tail -80
  tar czf "$out/test-logs.tgz" -C /tmp/graphjit-gpu-logs .  # every file's whole log, in one file (few files come back)
  echo "== doctor"
  timeout 120 python3 -m graphjit doctor --framework torch 2>&1 | tail -40
} > "$log" 2>&1
{
  echo "== bench decode (torch)"
  timeout 420 python3 -m graphjit bench decode --backend torch --out "$out" --tag h200 2>&1 | tail -40
  echo "== bench train (torch)"
  timeout 240 python3 -m graphjit bench train --out "$out" --tag h200 2>&1 | tail -30
  echo "== bench train --mode step (the whole training step)"
  timeout 300 python3 -m graphjit bench train --mode step --out "$out" --tag h200 2>&1 | grep -v '^[EW][0-9]' | tail -12
  echo "== bench hf (transformers' Llama decode step)"
  timeout 420 python3 -m graphjit bench hf --out "$out" --tag h200 2>&1 | tail -20
  echo "== bench piecewise (attention islands)"
  timeout 300 python3 -m graphjit bench piecewise --out "$out" --tag h200 2>&1 | tail -20
  echo "== bench capture (vLLM's 51 sizes: capture_scope vs by hand)"
  timeout 240 python3 -m graphjit bench capture --profile --out "$out" --tag h200 2>&1 | tail -12
  echo "== bench generate (three families; the rest: --families, a call each)"
  timeout 420 python3 -m graphjit bench generate --families llama,gpt2,t5 --out "$out" --tag h200 2>&1 | tail -12
  echo "== bench dispatch"
  timeout 120 python3 -m graphjit bench dispatch --out "$out" --tag h200 2>&1 | tail -15
} >> "$log" 2>&1
tail -120 "$log"
