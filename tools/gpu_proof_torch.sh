#!/usr/bin/env bash
# The torch half of the GPU proof: tests, doctor, benchmarks, as named stages.
# Usage on the GPU machine (repo root): bash tools/gpu_proof_torch.sh OUTDIR [STAGE ...]
# Stages: build tests doctor host replay decode train step hf piecewise profile capture generate dispatch blas firstcall
#   genprofile
#   (host: bench decode --host-only; replay: tools/probes/replay_profile.py; decode: the whole bench decode, host cost
#   included; profile: the piecewise probe; blas: tools/probes/blas_workspace_pool.py four ways; firstcall:
#   tools/probes/first_call_profile.py for FIRSTCALL_FAMILIES, default "t5 gemma2", at FIRSTCALL_BATCH (1), with
#   FIRSTCALL_ARGS (--no-gc: the collector off in the profiled calls); genprofile:
#   tools/probes/generate_profile.py --tracer compile --hf-compiled GENPROFILE_RUNS times (3), each a fresh process, for
#   GENPROFILE_FAMILIES (gpt2) at GENPROFILE_BATCH (1); blas, firstcall and genprofile run only where named).
# None named: build tests doctor decode replay train step hf piecewise profile capture generate dispatch (host is in
# decode); together they take longer than one 600 s device call: name a few per call.  Each stage's exit status is logged ("== STAGE rc=N").
# GENERATE_FAMILIES (default llama,gpt2,t5) chooses the families of the generate stage, GENERATE_BUDGET its
# --time-budget in seconds (default 380; the stage's timeout is 40 s more): all twelve families take three calls,
# gpt2,llama,phi3,qwen2_vl,qwen2,mistral and t5,qwen3,qwen2_moe,mixtral and gemma2,gemma3_text, each with 540 (at
# 88ecf75, with 10 timed calls a variant, the first six took 521 s after build; t5,qwen3,qwen2_moe and three variants
# of Mixtral's batch-1 row filled a budget of 330; at 310e829 Gemma 2 and 3 with three more families overran 535).
# Writes into OUTDIR: proof-torch.log (everything printed), test-logs.tgz (each test file's whole log, in one file: a
# call returns only a few files), genprofile.tgz (each genprofile run's JSON), firstcall-pstats.tgz (FIRSTCALL_ARGS with
# --dump: each variant's whole profile), and the benchmarks' JSON and PNG files.
set -uf  # -f: the stage names are never globbed
out=${1:?usage: gpu_proof_torch.sh OUTDIR [STAGE ...]}
shift
stages=${*:-build tests doctor decode replay train step hf piecewise profile capture generate dispatch}
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
# the commit the results are labelled with: pass GRAPHJIT_COMMIT where the copy's git history may be older than its
# files (the device machine's copy: its tracked files differ from its HEAD, so the label gets "+tree")
if [ -z "${GRAPHJIT_COMMIT:-}" ]; then
  GRAPHJIT_COMMIT=$(git rev-parse --short HEAD 2>/dev/null)
  if [ -n "$GRAPHJIT_COMMIT" ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    GRAPHJIT_COMMIT="$GRAPHJIT_COMMIT+tree"
  fi
fi
export GRAPHJIT_COMMIT
mkdir -p "$out"
log="$out/proof-torch.log"
# the results' tag names the card they ran on (a call for an H200 may run on an H100)
tag=${GRAPHJIT_TAG:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -o 'H[0-9]00' | tr H h)}
tag=${tag:-gpu}

stage() {
  set -o pipefail  # a stage's status is its command's, not tail's
  case "$1" in
    build) timeout 180 python3 -m graphjit build 2>&1 | tail -5 ;;
    tests)
      timeout 420 python3 tools/gpu_tests.py -m "gpu and not paddle" -j 4 --logs /tmp/graphjit-gpu-logs 2>&1 | tail -80
      local rc=$?
      tar czf "$out/test-logs.tgz" -C /tmp/graphjit-gpu-logs .
      return $rc ;;
    doctor) timeout 120 python3 -m graphjit doctor --framework torch 2>&1 | tail -40 ;;
    host) timeout 120 python3 -m graphjit bench decode --host-only --backend torch --out "$out" --tag "$tag" 2>&1 | tail -30 ;;
    decode) timeout 420 python3 -m graphjit bench decode --backend torch --out "$out" --tag "$tag" 2>&1 | tail -40 ;;
    train) timeout 240 python3 -m graphjit bench train --out "$out" --tag "$tag" 2>&1 | tail -30 ;;
    step) timeout 300 python3 -m graphjit bench train --mode step --out "$out" --tag "$tag" 2>&1 | grep -v '^[EW][0-9]' | tail -12 ;;
    hf) timeout 420 python3 -m graphjit bench hf --out "$out" --tag "$tag" 2>&1 | tail -20 ;;
    piecewise) timeout 300 python3 -m graphjit bench piecewise --out "$out" --tag "$tag" 2>&1 | tail -22 ;;
    profile) timeout 120 python3 tools/probes/piecewise_profile.py --out "$out" 2>&1 | tail -45 ;;
    replay) timeout 120 python3 tools/probes/replay_profile.py --out "$out" 2>&1 | tail -45 ;;
    capture) timeout 240 python3 -m graphjit bench capture --profile --out "$out" --tag "$tag" 2>&1 | tail -12 ;;
    generate) timeout $(( ${GENERATE_BUDGET:-380} + 40 )) python3 -m graphjit bench generate \
                --families "${GENERATE_FAMILIES:-llama,gpt2,t5}" --time-budget "${GENERATE_BUDGET:-380}" \
                --out "$out" --tag "$tag" 2>&1 | tail -14 ;;
    dispatch) timeout 120 python3 -m graphjit bench dispatch --out "$out" --tag "$tag" 2>&1 | tail -15 ;;
    blas)  # each in a fresh process: the priming's time in the function's dtype (bf16) and in fp32, and whether the
      # capture stream's cuBLASLt product is still needed on this torch (--cublas-only: a pool left means it is)
      for args in "--library cublas" "--library cublas --dtype float32" "--library cublaslt" \
                  "--library cublaslt --cublas-only"; do
        timeout 60 python3 tools/probes/blas_workspace_pool.py $args 2>&1 | tail -1
      done ;;
    firstcall) for fam in ${FIRSTCALL_FAMILIES:-t5 gemma2}; do
        timeout 200 python3 tools/probes/first_call_profile.py --family "$fam" --batch "${FIRSTCALL_BATCH:-1}" --top 25 \
          ${FIRSTCALL_ARGS:-} --out "$out" 2>&1 | grep -E '^(graphed_compile|hf_compiled):|^wrote'
      done
      # --dump's pstats folders in one file (a call returns only a few files)
      if compgen -G "$out/pstats_*" >/dev/null; then
        (set +f; cd "$out" && tar czf firstcall-pstats.tgz pstats_* && rm -rf pstats_*)
      fi ;;
    genprofile)  # the compile tracer's decode against transformers' compiled one, per token, in fresh processes
      for fam in ${GENPROFILE_FAMILIES:-gpt2}; do
        for i in $(seq "${GENPROFILE_RUNS:-3}"); do
          timeout 150 python3 tools/probes/generate_profile.py --family "$fam" --batch "${GENPROFILE_BATCH:-1}" \
            --tracer compile --hf-compiled --iters 100 --out "$out/genprofile_${fam}_$i" 2>&1 \
            | grep -E '"(generate_us_per_token|forward_host_us_per_token|rest_us_per_token|replay_gpu_us|replay_host_us|whole_call_us)"|"(hf_compiled|graphed)": \{|Error'
        done
      done
      # every run's JSON in one file (a call returns only a few files: two of three were left out once)
      (set +f; cd "$out" && tar czf genprofile.tgz genprofile_* && rm -rf genprofile_*) ;;
    *) echo "unknown stage $1 (see the usage at the top of $0)"; return 2 ;;
  esac
}

{
  echo "== $(date -u +%FT%TZ) commit $GRAPHJIT_COMMIT, stages: $stages"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  # how fast this host runs Python now (host-bound timings of two runs compare only where this is close)
  python3 -c "from graphjit.bench.common import host_speed; print('host speed', host_speed())"
  for s in $stages; do
    echo "== $s ($(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg))"
    stage "$s"
    echo "== $s rc=$? ($(date -u +%T))"
  done
  echo "== done ($(date -u +%T))"
} > "$log" 2>&1
tail -150 "$log"
