#!/usr/bin/env bash
# The GPU-node driver: builds what the given tasks need (the `gpu` CMake preset, build-gpu/), then
# runs the tasks in order. Every step runs under `timeout` with its own log in $OUT/logs; a
# failing step does not stop the later ones; the exit status is non-zero when one failed.
#
#   OUT=/some/dir [GPU=H200] [BUILD=0] [PACK=1] [DRY_RUN=1] scripts/device/run.sh TASK...
#   scripts/device/run.sh --list          the tasks and their options
#
# GPU=text stops at once (exit 3), before the build, when the first GPU's name does not contain
# it. BUILD=0 uses build-gpu/ as it is. PACK=1 packs $OUT/logs into $OUT/logs.tgz at the end.
# DRY_RUN=1 prints the commands and runs nothing (DRY_GPUS=N: the GPU count to plan for).
# The tables worth reading are copied from $OUT/logs to $OUT/*.txt. scripts/device/README.md
# gives the task lists that reproduce each figure of docs/performance.md.
set -uo pipefail

tasks_help() {
  cat <<'EOF'
tasks (in the order given; options are environment variables):
  build              everything in build-gpu/ (the other tasks build only what they run)
  ctest              every test but the Slurm ones (ctest -LE slurm), then `mtplab info` on 2 ranks
  test               the GPU tests (ctest -L gpu); then test_gpu_e2e with and without programmatic
                     launch (their agreement lines compared), test_dist_nccl on 2 GPUs and
                     compute-sanitizer memcheck / racecheck on the norm, router, expert, fused, MLA,
                     indexer, grouped-expert and ragged-rows tests (every error site counted in
                     sanitizer.txt; the summary and test_gpu_online's near-tie counts in
                     gpu_tests.txt). TESTS=regex: only `ctest -L gpu -R regex`; SANITIZER=0: no
                     sanitizer
  bench-kernels      mtplab_bench_kernels (KERNELS_ARGS, default "--reps 60")
  bench-step         mtplab_bench_step, B = 1 (STEP_ARGS, default "--context 4096 --reps 30 --k 1,4");
                     BASE=1: also the tree in .base/ (scripts/device/base-tree.sh COMMIT) and this
                     one in turn, BASE_RUNS (2) times each, same GPU -> bench_step_base.txt
  bench-step-nopdl   the same with programmatic dependent launch off (MTPLAB_CUDA_PDL=0, k = 4)
  bench-step-cgemm   the prefill as GEMMs (--context-gemm, FP8 head, graph on, k = 1)
  bench-batch        the batched step at B = BATCHES (1,2,4,8,16,32,64,128), both heads, graph on,
                     REPS (20); BATCH_ARGS adds arguments (e.g. "--router-bias-scale 0.2");
                     BASE=1: also the tree in .base/ and this one in turn, BASE_RUNS (2) times each,
                     same GPU -> bench_batch_base.txt
  bench-verify       one target layer at B sequences x R new rows and the head over them
                     (mtplab_bench_verify) at BATCHES, ROWS (1,...,5), CTX (4096), REPS (20);
                     VERIFY_PEER=path/to/torch_graph_peer_verify.py: the peer in the same run and
                     the side-by-side table (verify_ratio.txt)
  bench-exchange     mtplab_bench_exchange on RANKS (2) GPUs, blocking and non-blocking communicator
  peer-step          the PyTorch peer's draft step on mtplab's weights: export bench_step's
                     weights (all 288 experts, or PEER_EXPERTS), mtplab_bench_step on them, then
                     bench/peer/peer_step.py (eager, graph, compile) within BUDGET s (285)
  peer-batch         PEER=path/to/torch_graph_peer_batched.py at BATCHES, and the side-by-side
                     table with bench-batch's (batch_ratio.txt; run bench-batch first); EQ=1: the
                     batched bench again at the peer's routing (--router-bias-scale 0.2) -> eq/
  ncu-step           ncu per-kernel profile of one eager FP8 draft (ncu_step.csv)
  ncu-batch          ncu profile of the eager batched step at NCU_BATCHES (1,2,16,128), both heads,
                     summarised per kernel by scripts/device/ncu_summary.py (ncu_batch.txt)
  gemv-sweep         the GEMV variants (VARIANTS, default "v1 rows4 occ"): the variant test, the
                     GEMV cases of bench_kernels and the GEMV op tests under each (gemv_sweep.txt)
  playgrounds        the kernel playgrounds of dev/cuda (the comparison kernels no rule picks:
                     GEMV rows2 / fp8split, indexer scores / select v1, MLA shared, MoE spread /
                     regs / ring / split) against the CPU reference, timed against the library's
                     choice (REPS, 50; playgrounds.txt)
  resources          cuobjdump's register / shared-memory report of the kernels, 16-byte loads
                     and local-memory spills
  fixtures           the transformers reference fixtures (tests/reference), and their check
  exp:NAME           experiments/NAME.yaml on RANKS (1) GPUs into $OUT/NAME.h5, at most EXP_S s
                     (600; SIGTERM: the finished points stay, a rerun with RESUME_H5=file resumes);
                     EXP_ARGS adds arguments (e.g. "--set backend=cuda")
  plan-online        experiments/online-plan-check.yaml on one GPU (EXP_S), then `mtplab plan` on its
                     results: acceptance from the B = 1 points (PLAN_POINTS, p4,p8,p12,p16), every
                     cost from the online points; its prediction against each point's tokens/s per
                     sequence (plan_online.txt), failing when one is off by more than 10%
  rank-scaling       for each N of NS (1 2 4 8 that the node has): at N > 1 test_gpu_e2e_mpi and
                     mtplab_bench_exchange at N ranks; experiments/rank-scaling.yaml at N ranks
                     (EXP_S each) and its drafts against the 1-GPU run (scaling.txt)
EOF
}

if [[ ${1:-} == --list || ${1:-} == -h || ${1:-} == --help || $# -eq 0 ]]; then
  tasks_help
  (($#)) || exit 2
  exit 0
fi

# shellcheck source=scripts/device/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# The CMake targets a task runs ("all": the whole build).
targets_of() {
  case $1 in
    build | ctest | test) echo all ;;
    bench-kernels) echo mtplab_bench_kernels ;;
    bench-step | bench-step-nopdl | bench-step-cgemm | bench-batch | peer-batch | ncu-step | ncu-batch)
      echo mtplab_bench_step ;;
    bench-verify) echo mtplab_bench_verify ;;
    bench-exchange) echo mtplab_bench_exchange ;;
    peer-step) echo mtplab_export_weights mtplab_bench_step ;;
    gemv-sweep) echo test_ops_gpu test_ops_gpu_dense test_ops_gpu_mla mtplab_bench_kernels ;;
    playgrounds) echo mtplab_dev_gemv mtplab_dev_indexer mtplab_dev_mla mtplab_dev_moe ;;
    resources) echo mtplab_ops ;;
    fixtures) ;;
    exp:* | plan-online) echo mtplab ;;
    rank-scaling) echo mtplab test_gpu_e2e_mpi mtplab_bench_exchange ;;
    *) echo "unknown task '$1' (scripts/device/run.sh --list)" >&2; return 1 ;;
  esac
}

# ---- the tasks --------------------------------------------------------------------------------

task_ctest() {
  step "ctest -LE slurm"
  run ctest 600 ctest --test-dir "$BUILD_DIR" -j 8 -LE slurm --output-on-failure --timeout 300
  dry || grep -E "tests passed|tests failed|\*\*\*|Not Run" "$LOG/ctest.log" | head -40
  step "mtplab info, 2 ranks"
  run info 60 mpirun -np 2 --oversubscribe "$BIN/mtplab" info --backend cuda
  dry || cut -c1-200 "$LOG/info.log"
}

task_test() {
  if [[ ${TESTS:-1} == 0 ]]; then echo "GPU tests skipped (TESTS=0)"; return; fi
  local sel=()
  [[ ${TESTS:-1} != 1 ]] && sel=(-R "$TESTS")
  step "GPU tests (ctest -L gpu ${sel[*]})"
  run gpu_tests 900 ctest --test-dir "$BUILD_DIR" -L gpu "${sel[@]}" -j 2 --output-on-failure --timeout 600
  # The summary, and the near-tie counts test_gpu_online prints (ctest keeps a passing test's output
  # in LastTest.log only), into $OUT/gpu_tests.txt.
  dry || {
    grep -E "tests passed|Failed|\*\*\*|Skipped" "$LOG/gpu_tests.log" | head -20
    grep -h "^\[online cuda\]" "$BUILD_DIR/Testing/Temporary/LastTest.log" 2>/dev/null
  } | tee "$OUT/gpu_tests.txt"
  [[ ${TESTS:-1} != 1 ]] && return
  step "test_gpu_e2e with and without programmatic launch"
  CUDA_VISIBLE_DEVICES=0 run test_gpu_e2e 300 "$TESTS_BIN/test_gpu_e2e"
  MTPLAB_CUDA_PDL=0 CUDA_VISIBLE_DEVICES=0 run test_gpu_e2e_nopdl 300 "$TESTS_BIN/test_gpu_e2e"
  if ! dry; then
    if cmp -s <(grep agree "$LOG/test_gpu_e2e.log") <(grep agree "$LOG/test_gpu_e2e_nopdl.log"); then
      echo "agreement lines identical with and without PDL"
    else
      echo "agreement lines DIFFER with and without PDL"
      dev_status=1
    fi
  fi
  if (($(gpu_count) >= 2)); then
    step "test_dist_nccl, 2 ranks"
    run test_dist_nccl 180 mpirun -np 2 --oversubscribe "$TESTS_BIN/test_dist_nccl"
  fi
  if [[ ${SANITIZER:-1} != 0 ]]; then
    step "compute-sanitizer (every error site in $OUT/sanitizer.txt)"
    local tool
    for tool in memcheck racecheck; do
      sanitize ops test_ops_gpu '*Norm*:*Fused*tiny*:*Fused*small*'
      # The MLA decode and the indexer's scores and selection of one row (tiny).
      sanitize mla test_ops_gpu_mla 'Models/GpuMla.Mla/tiny'
      sanitize indexer test_ops_gpu_indexer 'Models/GpuIndexer.IndexerScoresAndSelect/tiny'
      # The norm family: one row at every shape, the vector and scalar widths, batched (tiny).
      sanitize norm test_ops_gpu_norm 'Models/GpuNorm.OneRow/*:GpuNormWidths.*:Models/GpuNorm.Batched/tiny'
      # The MoE family: the router and the experts of one row (tiny, small), the grouped experts
      # with their block items (200 rows; tiny).
      sanitize moe test_ops_gpu_moe \
        '*GpuMoe.Route/tiny:*GpuMoe.Route/small:*GpuMoe.Experts/tiny:*GpuMoe.Experts/small:*GpuMoe.ExpertsGrouped/tiny'
      # The ragged-rows cache writes and reads (rows of one slot in one launch).
      sanitize ragged test_ops_gpu_batch 'Models/GpuBatch.RaggedRows*/tiny:Models/GpuBatch.RaggedRows*/small'
    done
  fi
}

# sanitize NAME BINARY FILTER: compute-sanitizer --tool $tool on BINARY's tests matching FILTER
# (log sanitizer_NAME_$tool); its summary line printed, and every distinct error site (both sides
# of a race: the access, its function and source line) counted into $OUT/sanitizer.txt, which
# comes back with the other tables.
sanitize() {
  local name=$1 bin=$2 filter=$3 log summary
  CUDA_VISIBLE_DEVICES=0 run "sanitizer_${name}_$tool" 300 compute-sanitizer --tool "$tool" --error-exitcode 9 \
    "$TESTS_BIN/$bin" --gtest_filter="$filter"
  dry && return 0
  log=$LOG/sanitizer_${name}_$tool.log
  summary=$(grep -m1 -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log")
  echo "$summary"
  {
    echo "== $tool, $bin, $filter: ${summary:-no summary line (see logs/sanitizer_${name}_$tool.log)}"
    grep -E 'Race reported|^=+ +and |Invalid|^=+ +at |Error:' "$log" | sed -E 's/0x[0-9a-f]+/0x./g' |
      sort | uniq -c | sort -rn | head -40
  } >>"$OUT/sanitizer.txt"
}

task_bench_kernels() {
  step "mtplab_bench_kernels"
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=0 run bench_kernels 300 "$BIN/mtplab_bench_kernels" ${KERNELS_ARGS:---reps 60} --out "$LOG/kernels"
  keep bench_kernels
  dry || grep -vE "^\s*$" "$LOG/bench_kernels.log" | tail -40 | cut -c1-200
}

task_bench_step() {
  step "mtplab_bench_step, B = 1"
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=0 run bench_step 300 "$BIN/mtplab_bench_step" ${STEP_ARGS:---context 4096 --reps 30 --k 1,4} \
    --out "$LOG/step"
  keep bench_step
  dry || tail -12 "$LOG/bench_step.log"
  [[ ${BASE:-0} == 1 ]] || return 0
  step "B = 1 against the tree in .base/, in turn, same GPU"
  base_vs_head bench_step 120 bench_step_base.txt "git |^(bf16|fp8) " --context 4096 --k 1 --graphs on --reps 30
}

task_bench_step_nopdl() {
  step "mtplab_bench_step, programmatic launch off"
  MTPLAB_CUDA_PDL=0 CUDA_VISIBLE_DEVICES=0 run bench_step_nopdl 150 "$BIN/mtplab_bench_step" --context 4096 \
    --reps 30 --k 4 --out "$LOG/nopdl"
  keep bench_step_nopdl
  dry || tail -5 "$LOG/bench_step_nopdl.log"
}

task_bench_step_cgemm() {
  step "mtplab_bench_step --context-gemm: the prefill as GEMMs"
  CUDA_VISIBLE_DEVICES=0 run bench_step_context_gemm 150 "$BIN/mtplab_bench_step" --context 4096 --reps 10 --k 1 \
    --heads fp8 --graphs on --context-gemm --out "$LOG/cgemm"
  keep bench_step_context_gemm
  dry || grep -h "prefill of" "$LOG/bench_step_context_gemm.log"
}

task_bench_batch() {
  step "batched draft step at B = ${BATCHES:-1,2,4,8,16,32,64,128}"
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=0 run bench_step_batch 300 "$BIN/mtplab_bench_step" --batch "${BATCHES:-1,2,4,8,16,32,64,128}" \
    --k 1 --graphs on --reps "${REPS:-20}" --out "$OUT" ${BATCH_ARGS:-}
  keep bench_step_batch
  dry || tail -20 "$LOG/bench_step_batch.log"
  [[ ${BASE:-0} == 1 ]] || return 0
  step "the batched step against the tree in .base/, in turn, same GPU"
  # shellcheck disable=SC2086
  base_vs_head bench_batch 300 bench_batch_base.txt "git |^ *(bf16|fp8) " --batch "${BATCHES:-1,2,4,8,16,32,64,128}" \
    --k 1 --graphs on --reps "${REPS:-20}" ${BATCH_ARGS:-}
}

# base_vs_head NAME SECONDS TABLE PATTERN ARGS...: mtplab_bench_step of the tree in .base/ and of
# this one in turn, BASE_RUNS (2) times each, same GPU, with ARGS; the lines matching PATTERN of
# each run go to $OUT/TABLE.
base_vs_head() {
  local name=$1 secs=$2 table=$3 pattern=$4 i who bin
  shift 4
  base_build || return
  for ((i = 1; i <= ${BASE_RUNS:-2}; i++)); do
    for who in base head; do
      bin=$BIN/mtplab_bench_step
      [[ $who == base ]] && bin=.base/build-base/bin/mtplab_bench_step
      CUDA_VISIBLE_DEVICES=0 run "${name}_${who}_$i" "$secs" "$bin" "$@" --out "$LOG/${name}_$who$i"
    done
  done
  dry && return
  for ((i = 1; i <= ${BASE_RUNS:-2}; i++)); do
    for who in base head; do
      echo "=== $who, run $i"
      grep -E "$pattern" "$LOG/${name}_${who}_$i.log"
    done
  done | tee "$OUT/$table"
}

# The tree in .base/ (scripts/device/base-tree.sh COMMIT) built once: its mtplab_bench_step.
base_build() {
  if [[ ! -f .base/CMakeLists.txt ]]; then
    echo "BASE=1 but no .base/ here: run scripts/device/base-tree.sh COMMIT first and bring .base along"
    dev_status=1
    return 1
  fi
  [[ -x .base/build-base/bin/mtplab_bench_step ]] && return 0
  # The cuda preset with the gpu preset's settings: an earlier tree may predate the gpu preset.
  (cd .base && run base_configure 300 cmake --preset cuda -B build-base -DMTPLAB_WERROR=OFF -DMTPLAB_TESTS=OFF &&
    run base_build 600 cmake --build build-base -j "$(nproc)" --target mtplab_bench_step)
}

task_bench_verify() {
  step "the verify-layer benchmark"
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=0 run bench_verify 420 "$BIN/mtplab_bench_verify" --batch "${BATCHES:-1,2,4,8,16,32,64,128}" \
    --rows "${ROWS:-1,2,3,4,5}" --context "${CTX:-4096}" --reps "${REPS:-20}" --out "$OUT" ${VERIFY_ARGS:-}
  keep bench_verify
  dry || tail -60 "$LOG/bench_verify.log"
  [[ -n ${VERIFY_PEER:-} ]] || return 0
  step "the PyTorch peer of a verify layer ($VERIFY_PEER)"
  OUT=$OUT BATCHES=${BATCHES:-1,2,4,8,16,32,64,128} ROWS=${ROWS:-1,2,3,4,5} CTX=${CTX:-4096} REPS=${REPS:-20} \
    CUDA_VISIBLE_DEVICES=0 run peer_verify 420 python3 "$VERIFY_PEER"
  keep peer_verify
  run verify_ratio 60 python3 bench/peer/verify_ratio.py "$OUT/bench_verify.csv" "$OUT/torch_graph_peer_verify.json"
  keep verify_ratio
  dry || cat "$LOG/verify_ratio.log"
}

task_bench_exchange() {
  local n=${RANKS:-2} blocking
  for blocking in 1 0; do
    step "mtplab_bench_exchange, $n ranks, MTPLAB_NCCL_BLOCKING=$blocking"
    MTPLAB_NCCL_BLOCKING=$blocking run "bench_exchange_blocking$blocking" 150 mpirun -np "$n" --oversubscribe \
      --bind-to none -x MTPLAB_NCCL_BLOCKING "$BIN/mtplab_bench_exchange" --reps 100 --out "$LOG/exchange$blocking"
    keep "bench_exchange_blocking$blocking"
    dry || grep -E "^case|^bare_|^packed_u64|^allgather_|^bf16_lanes|target" "$LOG/bench_exchange_blocking$blocking.log"
  done
}

task_peer_step() {
  local budget=${BUDGET:-285} t_start experts scratch preset need_gb shm_free_gb left
  t_start=$(date +%s)
  experts=${PEER_EXPERTS:-288}
  need_gb=$((experts >= 288 ? 24 : 8))
  shm_free_gb=$(df -BG --output=avail /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)
  if dry; then
    scratch=/dev/shm/mtplab-peer.DRY
  elif [[ -n $shm_free_gb ]] && ((shm_free_gb > need_gb)); then
    scratch=$(mktemp -d /dev/shm/mtplab-peer.XXXXXX)   # no disk write of 18 GB
  else
    scratch=$(mktemp -d "$dev_root/$BUILD_DIR/peer-scratch.XXXXXX")
  fi
  preset=configs/glm5.3-flash.yaml
  if [[ $experts != 288 ]]; then
    preset=$scratch/glm5.3-flash-e$experts.yaml
    sed -e "s/^name: .*/name: glm5.3-flash-e$experts/" -e "s/^n_routed_experts: .*/n_routed_experts: $experts/" \
      configs/glm5.3-flash.yaml >"$preset"
  fi
  step "peer: export bench_step's weights ($experts routed experts) to $scratch"
  if ! run export_weights 150 "$BIN/mtplab_export_weights" --preset "$preset" --seed 11 --out "$scratch/mtp.safetensors"; then
    rm -rf "$scratch"
    return
  fi
  step "peer: mtplab_bench_step on those weights"
  CUDA_VISIBLE_DEVICES=0 run bench_step_peer_weights 120 "$BIN/mtplab_bench_step" --preset "$preset" --context 4096 \
    --reps 30 --k 1 --out "$LOG/peer"
  keep bench_step_peer_weights
  left=$((budget - ($(date +%s) - t_start)))
  step "peer: bench/peer/peer_step.py, $left s left"
  if ((left > 40)) || dry; then
    CUDA_VISIBLE_DEVICES=0 run peer_step "$left" python3 bench/peer/peer_step.py --weights "$scratch/mtp.safetensors" \
      --preset glm5.3-flash --experts "$experts" --context 4096 --reps 30 --warmup 4 \
      --variants eager,graph,compile --deadline-s $((left - 8)) --mtplab-csv "$LOG/peer/bench_step.csv" --out "$OUT"
    keep peer_step
    dry || sed -n '/^draft step (k=1/,/^wrote/p' "$LOG/peer_step.log" | grep -v "^wrote"
  else
    echo "peer_step skipped: $left s left of BUDGET=$budget"
    dev_status=1
  fi
  rm -rf "$scratch"
}

task_peer_batch() {
  if [[ -z ${PEER:-} ]] || { [[ ! -f $PEER ]] && ! dry; }; then
    echo "peer-batch: PEER=path/to/torch_graph_peer_batched.py names no file: skipped"
    dev_status=1
    return
  fi
  step "the batched PyTorch peer ($PEER)"
  OUT=$OUT BATCHES=${BATCHES:-1,2,4,8,16,32,64,128} REPS=${REPS:-20} CUDA_VISIBLE_DEVICES=0 \
    run peer_batch 240 python3 "$PEER"
  keep peer_batch
  run batch_ratio 60 python3 bench/peer/batch_ratio.py "$OUT/bench_step_batch.csv" "$OUT/torch_graph_peer_batched.json"
  keep batch_ratio
  dry || cat "$LOG/batch_ratio.log"
  [[ ${EQ:-0} == 1 ]] || return 0
  step "batched step at the peer's routing (--router-bias-scale 0.2)"
  mkdir -p "$OUT/eq"
  CUDA_VISIBLE_DEVICES=0 run bench_step_batch_eq 300 "$BIN/mtplab_bench_step" --batch "${BATCHES:-1,2,4,8,16,32,64,128}" \
    --k 1 --graphs on --reps "${REPS:-20}" --router-bias-scale 0.2 --out "$OUT/eq"
  run batch_ratio_eq 60 python3 bench/peer/batch_ratio.py "$OUT/eq/bench_step_batch.csv" "$OUT/torch_graph_peer_batched.json"
  keep batch_ratio_eq
  dry || cat "$LOG/batch_ratio_eq.log"
}

ncu_metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum

task_ncu_step() {
  step "ncu: one eager FP8 draft"
  CUDA_VISIBLE_DEVICES=0 run ncu_step 200 ncu --clock-control none --profile-from-start off --csv \
    --metrics "$ncu_metrics,launch__grid_size,launch__block_size,launch__registers_per_thread" \
    "$BIN/mtplab_bench_step" --heads fp8 --graphs off --k 1 --reps 3 --warmup 2 --profile --out "$LOG/ncu"
  dry || cp "$LOG/ncu_step.log" "$OUT/ncu_step.csv"
}

task_ncu_batch() {
  local batches=${NCU_BATCHES:-1,2,16,128} labels h b
  step "ncu: the eager batched step at B = $batches"
  CUDA_VISIBLE_DEVICES=0 run ncu_batch 240 ncu --clock-control none --cache-control none --profile-from-start off \
    --csv --metrics "$ncu_metrics" "$BIN/mtplab_bench_step" --batch "$batches" --k 1 --graphs off --reps 2 --warmup 1 \
    --profile --out "$LOG/ncu_batch"
  labels=$(for h in bf16 fp8; do for b in ${batches//,/ }; do printf '%s:%s,' "$h" "$b"; done; done)
  run ncu_batch_summary 60 python3 scripts/device/ncu_summary.py "$LOG/ncu_batch.log" --reps 2 --labels "${labels%,}"
  keep ncu_batch_summary
  dry || head -c 6000 "$LOG/ncu_batch_summary.log"
}

task_gemv_sweep() {
  local variants v
  read -r -a variants <<<"${VARIANTS:-v1 rows4 occ}"
  local cases="linear eh_proj,linear q_b,linear kv_b,mla_out_v,linear_fp8 eh_proj,head_argmax bf16,head_argmax fp8,linear o_proj,linear_group"
  local dense_tests='Models/GpuDense.Linear/*:Models/GpuDense.HeadArgmax/tiny:Models/GpuDense.HeadArgmax/small'
  local fused_tests='Shapes/GpuFused.LinearGroup*'
  local mla_tests='Models/GpuMla.Mla/tiny:Models/GpuMla.Mla/small'
  step "GEMV variants: the variant test"
  (unset MTPLAB_GEMV_VARIANT MTPLAB_GEMV_SPLIT
   CUDA_VISIBLE_DEVICES=0 run gemv_variant_test 90 "$TESTS_BIN/test_ops_gpu" --gtest_filter='GpuGemvVariants.*')
  for v in "${variants[@]}"; do
    step "GEMV variant $v: bench_kernels, then the GEMV op tests"
    MTPLAB_GEMV_VARIANT=$v CUDA_VISIBLE_DEVICES=0 run "gemv_bench_$v" 60 "$BIN/mtplab_bench_kernels" \
      --reps "${REPS:-30}" --only "$cases" --out "$LOG/gemv_$v"
    MTPLAB_GEMV_VARIANT=$v CUDA_VISIBLE_DEVICES=0 run "gemv_tests_$v" 60 "$TESTS_BIN/test_ops_gpu_dense" \
      --gtest_filter="$dense_tests"
    MTPLAB_GEMV_VARIANT=$v CUDA_VISIBLE_DEVICES=0 run "gemv_fused_tests_$v" 60 "$TESTS_BIN/test_ops_gpu" \
      --gtest_filter="$fused_tests"
    MTPLAB_GEMV_VARIANT=$v CUDA_VISIBLE_DEVICES=0 run "gemv_mla_tests_$v" 60 "$TESTS_BIN/test_ops_gpu_mla" \
      --gtest_filter="$mla_tests"
  done
  dry && return
  python3 - "$LOG" "${variants[@]}" <<'PY' 2>&1 | tee "$OUT/gemv_sweep.txt"
import csv, os, sys
log, variants = sys.argv[1], sys.argv[2:]
cases = ["linear eh_proj", "linear q_b", "linear kv_b", "mla_out_v", "linear_fp8 eh_proj", "head_argmax bf16",
         "head_argmax fp8", "linear o_proj", "fused u_proj: linear_group"]
rows = {}
for v in variants:
    path = os.path.join(log, f"gemv_{v}", "bench_kernels.csv")
    if not os.path.exists(path):
        continue
    with open(path) as f:
        lines = [l for l in f if not l.startswith("#")]
    for r in csv.DictReader(lines):
        if r["graph_median_us"]:
            rows[(r["op"], v)] = (float(r["graph_median_us"]), 100 * float(r["graph_frac_of_copy"]))
print("graph mode (20 launches per graph), per launch: us (% of copy bandwidth)")
print(f"{'case':28}" + "".join(f"{v:>18}" for v in variants))
for c in cases:
    cells = [f"{rows[(c, v)][0]:.2f} ({rows[(c, v)][1]:.1f}%)" if (c, v) in rows else "-" for v in variants]
    print(f"{c:28}" + "".join(f"{x:>18}" for x in cells))
PY
}

task_playgrounds() {
  local p
  : >"$OUT/playgrounds.txt"
  for p in gemv indexer mla moe; do
    step "playground mtplab_dev_$p"
    CUDA_VISIBLE_DEVICES=0 run "dev_$p" 600 "$BIN/mtplab_dev_$p" --reps "${REPS:-50}"
    dry || cat "$LOG/dev_$p.log" >>"$OUT/playgrounds.txt"
  done
  dry || grep -E "FAIL|every check held|check\(s\) failed" "$OUT/playgrounds.txt"
}

task_resources() {
  step "cuobjdump: resources, 16-byte loads, spills"
  local lib=$BUILD_DIR/lib/libmtplab_ops.a
  run resource_usage 120 cuobjdump --dump-resource-usage "$lib"
  run ops_sass 300 cuobjdump --dump-sass "$lib"
  keep resource_usage
  dry && return
  echo "LDG.E.128 (16-byte global loads) in the ops library: $(grep -c 'LDG.E.128' "$LOG/ops_sass.log")"
  echo "local-memory spills (LDL/STL): $(grep -cE '\b(LDL|STL)\b' "$LOG/ops_sass.log")"
  gzip -f "$LOG/ops_sass.log"
}

task_fixtures() {
  step "transformers reference fixtures"
  mkdir -p "$OUT/ref"
  run make_fixtures 240 python3 tests/reference/make_fixtures.py --out "$OUT/ref"
  run check_fixtures 120 python3 tests/reference/check_fixtures.py "$OUT/ref"
  dry || tail -40 "$LOG/check_fixtures.log"
}

# run_exp NAME RANKS H5 LOGNAME ARGS...: one experiment, resumable, stopped by SIGTERM at EXP_S.
run_exp() {
  local name=$1 n=$2 h5=$3 logname=$4
  shift 4
  local launch=("$BIN/mtplab")
  ((n > 1)) && launch=(mpirun -np "$n" --oversubscribe --bind-to none "$BIN/mtplab")
  local visible=()
  ((n == 1)) && visible=(env CUDA_VISIBLE_DEVICES=0)
  run "$logname" "${EXP_S:-600}" "${visible[@]}" "${launch[@]}" run "experiments/$name.yaml" \
    --out "$h5" "$@"
  dry || grep -vE "^\s*$" "$LOG/$logname.log" | tail -30 | cut -c1-220
}

task_exp() {
  local name=$1 args=()
  [[ -f experiments/$name.yaml ]] || { echo "exp:$name: no experiments/$name.yaml" >&2; dev_status=1; return; }
  [[ -n ${EXP_ARGS:-} ]] && eval "args=($EXP_ARGS)"
  [[ -n ${RESUME_H5:-} && -f $RESUME_H5 ]] && cp "$RESUME_H5" "$OUT/$name.h5"
  step "experiments/$name.yaml on ${RANKS:-1} GPU(s)"
  run_exp "$name" "${RANKS:-1}" "$OUT/$name.h5" "exp_$name" "${args[@]}"
}

task_plan_online() {
  local h5=$OUT/online-plan-check.h5
  step "experiments/online-plan-check.yaml on one GPU"
  run_exp online-plan-check 1 "$h5" exp_online_plan_check
  step "mtplab plan on its online points: the prediction against the online loop"
  run plan_online 300 "$BIN/mtplab" plan --model data/trained-mini/trained-mini.yaml --set model.layers=4 \
    --results "$h5" --points "${PLAN_POINTS:-p4,p8,p12,p16}" --online "$h5" --set costs.online_terms=all \
    --out "$OUT/plan-online.h5" --force
  dry && return
  sed -n '/^prediction against the online points/,/^$/p' "$LOG/plan_online.log" | cut -c1-220 |
    tee "$OUT/plan_online.txt"
  # The last column is plan / point: every (B, k) within 10%.
  if awk '/^prediction against/ {on = 1; getline; next} on && NF {r = $NF; if (r < 0.9 || r > 1.1) bad = 1; n++}
          END {exit !(n > 0 && !bad)}' "$OUT/plan_online.txt"; then
    echo "every prediction within 10% of the online loop" | tee -a "$OUT/plan_online.txt"
  else
    echo "a prediction off by more than 10% (or none made)" | tee -a "$OUT/plan_online.txt"
    dev_status=1
  fi
}

points_summary() {  # label, steps, propose and step medians of one results file
  python3 - "$1" <<'PY' 2>&1
import sys
sys.path.insert(0, "analysis")
import mtplab_results as mr
p = mr.Results(sys.argv[1]).points
print(sys.argv[1])
print(p[["label", "steps", "propose_ms_median", "step_ms_median", "step_ms_rel_spread"]].to_string(index=False))
PY
}

task_rank_scaling() {
  local gpus n h5 extra
  gpus=$(gpu_count)
  local ns=${NS:-$(for n in 1 2 4 8; do ((n <= gpus)) && printf '%s ' "$n"; done)}
  echo "rank scaling: $gpus GPU(s); rank counts: $ns" | tee "$OUT/scaling.txt"
  for n in $ns; do
    if ((n > gpus)); then
      echo "$n ranks: skipped, $gpus GPU(s) on this node" | tee -a "$OUT/scaling.txt"
      dev_status=1
      continue
    fi
    h5=$OUT/rank-scaling-${n}gpu.h5
    if ((n == 1)); then
      step "rank scaling: 1 GPU, head none"
      run_exp rank-scaling 1 "$h5" rank-scaling-1gpu --set 'sweep.grid.head_sharding=[none]'
    else
      step "rank scaling: $n ranks"
      run "test_gpu_e2e_mpi-$n" 300 mpirun -np "$n" --oversubscribe "$TESTS_BIN/test_gpu_e2e_mpi"
      run "bench_exchange-$n" 180 mpirun -np "$n" --oversubscribe "$BIN/mtplab_bench_exchange" --out "$LOG/exchange-$n"
      dry || tail -12 "$LOG/bench_exchange-$n.log" | tee -a "$OUT/scaling.txt"
      extra=()
      ((n == 2)) && extra=(--set 'sweep.grid.exchange=[packed_u64,allgather_pairs,allgather_logits,bf16_lanes]')
      run_exp rank-scaling "$n" "$h5" "rank-scaling-${n}gpu" "${extra[@]}"
    fi
    dry && continue
    points_summary "$h5" | tee -a "$OUT/scaling.txt"
    if ((n > 1)) && [[ -f $OUT/rank-scaling-1gpu.h5 ]]; then
      echo "-- drafts at $n ranks against 1 (near-ties counted)" | tee -a "$OUT/scaling.txt"
      python3 analysis/compare_drafts.py "$OUT/rank-scaling-1gpu.h5" "$h5" 2>&1 | grep -v UNPAIRED |
        tee -a "$OUT/scaling.txt"
    fi
  done
}

# ---- main -------------------------------------------------------------------------------------

# What to build: everything when a task needs it, else the union of the tasks' targets (a
# verify benchmark only where this tree has one), nothing when no task needs a binary.
targets=() build_all=0
for t in "$@"; do
  want=$(targets_of "$t") || exit 2
  for w in $want; do
    [[ $w == all ]] && build_all=1
    [[ $w == mtplab_bench_verify ]] && ! grep -q mtplab_bench_verify bench/CMakeLists.txt 2>/dev/null && continue
    [[ " ${targets[*]} " == *" $w "* ]] || targets+=("$w")
  done
done

gpu_guard
env_report
if ((build_all)); then
  gpu_build
elif ((${#targets[@]})); then
  gpu_build "${targets[@]}"
fi
for t in "$@"; do
  case $t in
    build) ;;
    exp:*) task_exp "${t#exp:}" ;;
    *) "task_${t//-/_}" ;;
  esac
done
[[ ${PACK:-0} == 1 ]] && pack logs
step "done, status $dev_status; outputs in $OUT"
exit $dev_status
