#!/usr/bin/env bash
# Mutation check of the test suite: applies each small deliberate bug of the
# list below to a copy of the tree (build-mutate/src, built in
# build-mutate/build; the first run builds it whole, later runs rebuild only
# what a mutation touches), runs the tests that should catch it, and prints
# which mutations the suite kills. Every listed mutation must be killed: the
# script exits 1 when one survives, or no longer applies (the code it
# names changed: update the list). A tool for this suite, not part of CI.
#   scripts/mutate.sh [NAME...]     (default: every mutation; --list names them)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
work="$root/build-mutate"
src="$work/src"
build="$work/build"

# name | file | text to find (exactly once; \n for a newline) | replacement | ctest -R of the tests that catch it
read -r -d '' MUTATIONS <<'EOF' || true
loss-divided-twice|core/src/run/TrainingLoop.cpp|runner != nullptr ? runner->scaled(out.loss_sum) : out.loss_sum / static_cast<double>(target_tokens),|runner != nullptr ? runner->scaled(out.loss_sum) : out.loss_sum / static_cast<double>(target_tokens * shape.grad_accum_steps),|TrainingInvariance.AccumulationSplitDoesNotChangeTheLoss
ddp-last-bucket-unreduced|plugins/strategies/ddp/DdpStrategy.cpp|  void start(Bucket& bucket) {\n    torch::NoGradGuard no_grad;|  void start(Bucket& bucket) {\n    torch::NoGradGuard no_grad;\n    if (&bucket == &buckets_.back()) {\n      bucket.work = comm_->all_reduce_sum_async(bucket.grads.clone());\n      return;\n    }|Distributed.TwoRanksTrainLikeOneProcess
neighbours-samples|core/src/run/Sampler.cpp|const int64_t begin = rank * per_rank + micro_step * shape.micro_batch_size;|const int64_t begin = ((rank + 1) % shape.world_size) * per_rank + micro_step * shape.micro_batch_size;|Sampler\.
ddp-rank-1-skips-update|plugins/strategies/ddp/DdpStrategy.cpp|  void apply_update(const UpdateArgs& args) override {\n    if (overlap_update_) {|  void apply_update(const UpdateArgs& args) override {\n    if (comm_->rank() == 1) {\n      discard_gradients();\n      return;\n    }\n    if (overlap_update_) {|Distributed.TwoRanksTrainLikeOneProcess
checkpoint-range-twice|core/src/checkpoint/Checkpoint.cpp|      for (const Range& range : written[r]) ranges.push_back(Json::array({range.group, range.begin, range.end}));|      for (const Range& range : written[r]) ranges.push_back(Json::array({range.group, range.begin, range.end}));\n      if (r == 0 && !written[r].empty()) ranges.push_back(ranges[0]);|Checkpoint.ExactResumeForEveryStrategyAtWorldSizeTwo
warmup-off-by-one|core/src/run/LrSchedule.cpp|peak_lr * static_cast<double>(step + 1)|peak_lr * static_cast<double>(step)|LrSchedule\.
adam-no-bias-correction|core/src/sharding/AdamW.cpp|  const double bias_correction1 = 1.0 - std::pow(config.beta1, static_cast<double>(step));\n  const double bias_correction2 = 1.0 - std::pow(config.beta2, static_cast<double>(step));\n#ifdef TRAINER_CUDA_KERNELS\n  if (own_kernel|  const double bias_correction1 = 1.0;\n  const double bias_correction2 = 1.0 - std::pow(config.beta2, static_cast<double>(step));\n#ifdef TRAINER_CUDA_KERNELS\n  if (own_kernel|AdamW\.
clipping-off|core/src/sharding/AdamW.cpp|  return std::min(1.0, max_norm / (total_norm + 1e-6));|  return 1.0;|GradientNorm\.
feistel-walks-one-short|core/src/run/Sampler.cpp|} while (x >= static_cast<uint64_t>(n_));|} while (x > static_cast<uint64_t>(n_));|Sampler\.
bpe-rightmost-first|core/src/text/Tokenizer.cpp|return rank != o.rank ? rank > o.rank : left > o.left;|return rank != o.rank ? rank > o.rank : left < o.left;|Tokenizer\.
checksum-ignored|core/src/checkpoint/Checkpoint.cpp|  if (hash != member(f, key, file).get<std::string>()) {|  if (false) {|Checkpoint.CorruptShardIsNamedAndAutoFallsBack
prune-any-lineage|core/src/checkpoint/Checkpoint.cpp|if (step < written_step && lineage_of(dir) == lineage_) mine.push_back(dir);|if (step < written_step) mine.push_back(dir);|HostileInput.CheckpointsOfAnotherRunAreNeitherMixedNorPruned
zero2-unreported-full-gradient|plugins/strategies/zero2/Zero2Strategy.cpp|    world_ = &comm;\n    device_ = env.device;|    world_ = &comm;\n    device_ = env.device;\n    static std::vector<torch::Tensor> kept;\n    for (const NamedParameter& p : model.parameters()) kept.push_back(torch::zeros_like(p.tensor));|Strategies.ZeroMemoryFormulasAtWorldSizeFour
zero3-unreported-step-copy|plugins/strategies/zero3/Zero3Strategy.cpp|    unit.ready = 0;\n    unit.in_backward = true;|    unit.ready = 0;\n    unit.in_backward = true;\n    static torch::Tensor copy;\n    copy = index + 1 == units_.size() ? torch::zeros({82496}) : index == 0 ? torch::Tensor() : copy;|Strategies.ZeroMemoryFormulasAtWorldSizeFour
muon-stack-entry-mixup|core/src/sharding/OptimizerShards.cpp|const torch::Tensor t = r.stacked ? r.transformed[static_cast<int64_t>(i)] : r.transformed;|const torch::Tensor t = r.stacked ? r.transformed[0] : r.transformed;|Muon.OptimizerShardsGiveEachStackedMatrixItsOwnUpdate
claims-equal-paths-only|core/src/util/StepFile.cpp|if (within(claim.path, held.path) \|\| within(held.path, claim.path)) return held.owner;|if (claim.path == held.path) return held.owner;|HostileInput.LoggerOutputsThatCollideAreRefused
refused-run-keeps-its-directories|core/src/util/Files.h|for (const std::filesystem::path& dir : made_) std::filesystem::remove(dir, error);|for (const std::filesystem::path& dir : made_) (void)dir;|HostileInput.ARefusedRunLeavesTheOutputDirectoryAsItWas
killed-export-record-ignored|core/src/tools/Export.cpp|const bool killed_writing = lock->left_record().find(kWriting) != std::string::npos;|const bool killed_writing = false;|HostileInput.ExportNeverReplacesWeightsAlreadyWritten
killed-check-scratch-kept|core/src/kit/Driver.cpp|    remove_abandoned(tmp, prefix);|    (void)tmp;|ConformanceScratch\.
EOF

if [ "${1:-}" = "--list" ]; then
  while IFS='|' read -r name _; do echo "$name"; done <<<"$MUTATIONS"
  exit 0
fi
wanted=("$@")

# The copy: tracked files as they are in the working tree (only those whose
# bytes differ are written, so they alone are newer than the copy's build),
# and the fetched tokenizer the tests read.
mkdir -p "$src"
git ls-files -z | python3 -c '
import os, shutil, sys
src = sys.argv[1]
for name in sys.stdin.buffer.read().decode().split("\0"):
    if not name or not os.path.isfile(name):
        continue
    target = os.path.join(src, name)
    if os.path.isfile(target) and open(name, "rb").read() == open(target, "rb").read():
        continue
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    shutil.copyfile(name, target)
    shutil.copymode(name, target)
' "$src"
scripts/fetch-tokenizer.sh >/dev/null
mkdir -p "$src/.cache" && rm -rf "$src/.cache/tokenizers" && cp -r .cache/tokenizers "$src/.cache/"
if [ ! -f "$build/CMakeCache.txt" ]; then
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S "$src" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRAINER_WERROR=OFF >/dev/null
fi
echo "building the copy (the first time: the whole tree)"
cmake --build "$build" -j "${TRAINER_BUILD_JOBS:-2}" >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }

# Applies (or with "restore", undoes) one mutation: exactly one occurrence.
edit() {
  python3 - "$@" <<'PY'
import sys
path, find, replace = sys.argv[1], sys.argv[2].replace("\\n", "\n").replace("\\|", "|"), sys.argv[3].replace("\\n", "\n").replace("\\|", "|")
text = open(path).read()
if text.count(find) != 1:
    sys.exit(f"{text.count(find)} occurrences")
open(path, "w").write(text.replace(find, replace))
PY
}

status=0
results=()
while IFS= read -r line; do
  [ -n "$line" ] || continue
  # Split on '|' not preceded by a backslash.
  mapfile -t fields < <(python3 -c 'import re,sys; [print(f) for f in re.split(r"(?<!\\)\|", sys.argv[1])]' "$line")
  name=${fields[0]} file=${fields[1]} find=${fields[2]} replace=${fields[3]} tests=${fields[4]}
  if [ ${#wanted[@]} -gt 0 ] && [[ ! " ${wanted[*]} " == *" $name "* ]]; then continue; fi
  cp "$src/$file" "$work/original"
  if ! why=$(edit "$src/$file" "$find" "$replace" 2>&1); then
    results+=("$name: DOES NOT APPLY to $file ($why)"); status=1
    continue
  fi
  if ! cmake --build "$build" -j "${TRAINER_BUILD_JOBS:-2}" >"$work/$name.build.log" 2>&1; then
    results+=("$name: DOES NOT COMPILE (see $work/$name.build.log)"); status=1
  elif (cd "$build" && ctest -R "$tests" -j "${TRAINER_TEST_JOBS:-2}" >"$work/$name.test.log" 2>&1); then
    results+=("$name: SURVIVED ($tests passed)"); status=1
  else
    failed=$(grep -cE "\(Failed\)|\(Timeout\)|Exception" "$work/$name.test.log" || true)
    results+=("$name: killed ($failed of the tests matching '$tests' failed)")
  fi
  cp "$work/original" "$src/$file"
  echo "${results[-1]}"
done <<<"$MUTATIONS"
cmake --build "$build" -j "${TRAINER_BUILD_JOBS:-2}" >"$work/build.log" 2>&1 || true  # back to the unmutated tree
echo
echo "mutations: ${#results[@]}"
printf '  %s\n' "${results[@]}"
exit $status
