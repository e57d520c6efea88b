#!/usr/bin/env bash
# On the GPU machine, from the project root (.deps staged by
# ../shared/device/stage-deps.sh and bench/stage-gpu-libs.sh, carried with
# .cache/tokenizers): configure and build into
# build-gpu, then the stages named in $STAGES (default: all), logs under $OUT.
#   tests   ctest -L gpu and -L unit      gpu   ctest -L gpu alone, three at a time
#   multigpu  ctest -L multigpu (a host with 8 GPUs; fails with fewer)
#   hf      bench/hf_logits_check.py on CUDA
#   b05     bench.py at the 0.5B shape     b3    bench.py at the 3B shape
#   tb      bench/tensorboard_check.py: the event files read by TensorBoard's reader
#   tok     bench/tokenizer_reference.py: Hugging Face tokenizers' ids for the test corpus
#           (Qwen3's tokenizer.json carried in .cache/tokenizers/qwen3)
#   tokb    bench/tokenize_bench.py: trainer tokenize against HF tokenizers (same corpus)
#   bpe     bench/tokenize_bench.py --long-pieces: one-piece documents of 1 kB to 1 MB, ids against HF
#   probe   bench/update_overlap_probe.py: can an update hide behind GEMMs (PyTorch alone, ~1 minute)
#   algo    bench/gemm_algo_probe.cu: cuBLASLt's algorithms timed against its heuristic's first ($ALGO_SHAPES)
#   gemm    bench/gemm_rate_probe.py: each GEMM of a step through cuBLAS and cuBLASLt ($GEMM_ARGS, e.g. --shape 0.5b)
# Extra bench.py arguments: $BENCH_ARGS (e.g. --arms ddp,zero3).
set -uo pipefail
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out"
stages=${STAGES:-tests hf b05 b3}
torch_prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
# UNITY=1 builds as scripts/build.sh does (batches of 8 sources; the CUDA
# kernels file by file); should a batch fail, it says so and builds file by
# file. On the H200 machine's 16 cores, 2026-12-06: the file-by-file fallback
# 109-125 s from nothing, the unity build 55 s with the kernels already built.
configure() {
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$torch_prefix;$PWD/.deps" \
    -DCMAKE_UNITY_BUILD="$1" -DCMAKE_UNITY_BUILD_BATCH_SIZE=8 >"$out/cmake.log" 2>&1 || { tail -40 "$out/cmake.log"; exit 1; }
}
started=$SECONDS
if [ "${UNITY:-0}" = 1 ]; then
  configure ON
  cmake --build build-gpu -j16 >"$out/build.log" 2>&1 ||
    { echo "unity build failed:"; grep -A12 -E "error|FAILED" "$out/build.log" | head -60; configure OFF; }
else
  configure OFF
fi
cmake --build build-gpu -j16 >>"$out/build.log" 2>&1 || { grep -A12 -E "error|FAILED" "$out/build.log" | head -100; exit 1; }
echo "built in $((SECONDS - started)) s (UNITY=${UNITY:-0}): $(grep -c warning "$out/build.log") warning lines"
status=0
for stage in $stages; do
  case $stage in
    tests) (cd build-gpu && ctest -L '^(gpu|unit)$' --output-on-failure) >"$out/ctest.log" 2>&1 || status=1
           grep -E "tests passed|Failed|FAILED|\*\*\*" "$out/ctest.log" | head -30 ;;
    # Three GPU tests at a time (CTEST_PARALLEL_LEVEL, default 3): 57 tests in 112 s on an H100 against ~320 s
    # one at a time, all passing (2026-12-06); set it to 1 when a failure might come from sharing the card.
    gpu) (cd build-gpu && CTEST_PARALLEL_LEVEL=${CTEST_PARALLEL_LEVEL:-3} ctest -L '^gpu$' --output-on-failure) \
           >"$out/ctest.log" 2>&1 || status=1
         grep -E "tests passed|Failed|FAILED|\*\*\*" "$out/ctest.log" | head -30 ;;
    multigpu) (cd build-gpu && ctest -L '^multigpu$' --output-on-failure) >"$out/multigpu.log" 2>&1 || status=1
           grep -E "tests passed|Failed|FAILED|\*\*\*" "$out/multigpu.log" | head -30 ;;
    hf) python3 bench/hf_logits_check.py --trainer build-gpu/bin/trainer --device cuda 2>&1 | tail -4 || status=1 ;;
    tb) python3 bench/tensorboard_check.py --trainer build-gpu/bin/trainer 2>&1 | tail -12 || status=1 ;;
    tok) python3 bench/tokenizer_reference.py --tokenizer .cache/tokenizers/qwen3/tokenizer.json \
           --out "$out/qwen3-expected.json" || status=1 ;;
    tokb) python3 bench/tokenize_bench.py --trainer build-gpu/bin/trainer --tokenizer .cache/tokenizers/qwen3 \
            ${TOKB_ARGS:-} 2>&1 | tail -12 || status=1 ;;
    bpe) python3 bench/tokenize_bench.py --trainer build-gpu/bin/trainer --tokenizer .cache/tokenizers/qwen3 \
           --long-pieces 2>&1 | tail -12 || status=1 ;;
    probe) python3 bench/update_overlap_probe.py 2>&1 | tail -12 || status=1 ;;
    algo) nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
          "$nvcc" -std=c++17 -O3 -arch=sm_90 -o "$out/gemm_algo_probe" bench/gemm_algo_probe.cu -lcublasLt || status=1
          for s in ${ALGO_SHAPES:-3b 0.5b}; do "$out/gemm_algo_probe" "$s" 2>&1 | tee -a "$out/algo.txt" || status=1; done
          rm -f "$out/gemm_algo_probe" ;;
    gemm) python3 bench/gemm_rate_probe.py ${GEMM_ARGS:-} 2>&1 | tee "$out/gemm.txt" | tail -30 || status=1 ;;
    b05|b3) shape=0.5b; [ "$stage" = b3 ] && shape=3b
            python3 bench/bench.py --trainer build-gpu/bin/trainer --shape $shape --json "$out/$stage.json" \
              ${BENCH_ARGS:-} 2>"$out/$stage.err" | tee "$out/$stage.txt" || status=1 ;;
  esac
done
exit $status
