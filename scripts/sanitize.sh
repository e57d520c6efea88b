#!/usr/bin/env bash
# The test suite under AddressSanitizer and UndefinedBehaviorSanitizer: a
# second build in build-asan/ (our code instrumented; LibTorch, as Debian
# ships it, is not), then every CPU test. Any report fails the test that
# hit it, and so the script.
#   scripts/sanitize.sh [ctest options]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
"$root/scripts/setup.sh"
# The tokenizer tests read a real tokenizer file, as in scripts/test.sh (run on its own, this script fetches it too).
"$root/scripts/fetch-tokenizer.sh" || echo "sanitize.sh: could not fetch the Qwen3 tokenizer (see scripts/fetch-tokenizer.sh)" >&2
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
# vptr: LibTorch's classes carry no UBSan type information (it is not instrumented).
flags="$flags -fno-sanitize=vptr"
if [ ! -f build-asan/CMakeCache.txt ]; then
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  # -O1: a third of the instrumented -O2 build time on two cores, the same
  # reports. -g1: line tables only (the reports' file:line), about an
  # eighth less compile time than full debug information. Unity batches as
  # in scripts/build.sh: half the compile time.
  cmake -S . -B build-asan "${generator[@]}" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
    -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DTRAINER_WERROR=ON -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=8 >/dev/null
fi
cmake --build build-asan -j "${TRAINER_BUILD_JOBS:-2}"
# Container-overflow checks need every library that touches a container
# instrumented; leaks are checked, with LibTorch's own one-time allocations
# (operator registries, thread pools) suppressed by library. A freed block
# stays poisoned until 16 MB more have been freed after it (the default is
# 256): with LibTorch's churn of tensors the default quarantine makes nearly
# every allocation touch fresh pages, and five of the suite's tests ran in
# 73 s instead of 94 on two cores (2026-12-05); a use after free is still
# caught while the block is among the last 16 MB freed.
export ASAN_OPTIONS="detect_container_overflow=0:detect_leaks=1:abort_on_error=1:strict_string_checks=1:quarantine_size_mb=16"
export LSAN_OPTIONS="suppressions=$root/scripts/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
cd build-asan
# Left to scripts/test.sh, where they run unsanitized: reproducible mode's
# three 24-run grids (under the sanitizers each takes longer than a test
# may; their code paths run here through the mode's other tests, its unit
# tests and the kit), the 16-run strategy matrix (the kit covers the same
# strategies and splits here), the chaos test's 20 kills and resumes
# (checkpoint writing, crashes and resumes run here in Checkpoint.* and
# Faults.*) and the generated plugin projects (five CMake builds of the
# templates: under the sanitizers 284 s, nearly all of it compiling):
# about eight minutes of the sanitized run on two cores. Also left there:
# three more multi-process grids whose code runs here in smaller tests
# (the latency grid: comm overlap, run by Distributed.TwoRanks*; resumes
# across strategies and world sizes: the checkpoint code of
# Checkpoint.ExactResume* and SeveralRanks.*; hybrid sharding's groups:
# CommGroups.* and the kit's hybrid splits): 256 s of the sanitized run.
# And the optimizer kit's grid (its code runs here in Optimizers.*, Muon.*,
# ConformanceOptimizers.MuonUnderZero3AtWorldSizeFour and the broken ones),
# exact resume for every strategy at world size two (95 s sanitized; resume
# and its checkpoint code run here in the kit's checkpoint checks,
# Checkpoint.* and SeveralRanks.*) and the accumulation-split grid of runs
# (60 s; the kit checks the same splits here in-process), and packed
# records at four splits and in reproducible mode (22 s; the packing, the
# collation of packed windows and the document mask run here in Packing.*,
# Collate.*, ModelContract.* and the other Datasets.Pack* tests), and the
# quickstart's 200-step convergence check (42 s sanitized; a longer run of
# the training loop every other training test runs here). Since 2026-12-05
# (a CI run of 84 minutes on a slower machine: the sanitized tests took
# 31 of them) also these grids, ~1,100 s of sanitized test time on two cores,
# whose code runs here in the tests named after each: the conformance
# kit's simpler splits per strategy (8x1x1, 4x1x2, 2x4x1, 1x8x1, 1x2x4;
# 2x2x2 and the hybrid 2x2x2x1 and 1x2x4x2 stay, which take every path the
# others do); reproducible resume across world sizes and strategies (146
# s; Checkpoint.*, SeveralRanks.* and the kit's checkpoint checks); the
# activation-checkpointing grid (120 s; ModelContract.*); the ZeRO memory
# formulas at world size four (105 s; Strategies.ZeroTwoHoldsAtMostTwo*);
# reproducible mode's gradient-keeping grid (78 s;
# ConformanceReproducible.*, Reproducible.LargerAtoms*); the seed
# scenario's accumulation grid, world size one against ddp, and the splits
# without the mode (67 + 46 + 36 s; the kit's splits); the kit's negative
# controls for broken accumulators and optimizers and its third-party
# plugin-directory run (57 + 61 + 51 s; the kit's code runs here in every
# positive conformance test). And the bad-recipe table through the CLI (95
# s, a sanitized process start for each of its recipes; the same parsing
# and checks run here in-process in Recipe.*, and under the fuzzer).
skip='Reproducible\..*ForEverySplitAndStrategy|Strategies\.AllStrategiesAndSplitsOfOneGlobalBatchAgree'
skip="$skip|Faults\.ChaosKillsAndResumesEndBitIdentical|Sdk\.NewPluginProjectsBuildAndPassTheirTests"
skip="$skip|Distributed\.CommunicationLatencyChangesNoBits|Checkpoint\.ResumesUnderAnotherStrategyAndWorldSize"
skip="$skip|Strategies\.HybridShardingHoldsItsGroupsShareAndAgrees|ConformanceOptimizers\.MuonAndLionPassUnderEveryStrategy"
skip="$skip|Checkpoint\.ExactResumeForEveryStrategyAtWorldSizeTwo|TrainingInvariance\.AccumulationSplitDoesNotChangeTheLoss"
skip="$skip|Datasets\.PackedRecordsTrainAlikeAtEverySplitAndCountTheirPadding|TrainingInvariance\.QuickstartHalvesItsLoss"
skip="$skip|Conformance\.MatchesTheFp64Reference/[a-z0-9]+_(8x1x1|4x1x2|2x4x1|1x8x1|1x2x4[^x])"
skip="$skip|Reproducible\.ResumedUnderAnotherWorldSizeAndStrategyIsTheSameRun|Reproducible\.WithoutTheModeSplitsDifferByRounding"
skip="$skip|Strategies\.ActivationCheckpointingChangesNoBitAtWorldSizeOne|Strategies\.ZeroMemoryFormulasAtWorldSizeFour"
skip="$skip|Strategies\.ReproducibleModeKeepsOnlyTheGradientTheUpdateReads|Strategies\.SeedScenarioAccumulationAgreesOnTheCpu"
skip="$skip|Strategies\.WorldSizeOneIsBitIdenticalToDdp"
skip="$skip|ConformanceNegativeControl\.BrokenAccumulatorsFail|ConformanceOptimizers\.BrokenOptimizersFail"
skip="$skip|ConformanceThirdParty\.StrategiesFoundThroughPluginDirAreCheckedAtEveryWorldSize"
skip="$skip|Cli\.BadRecipesExitWithTwoAndNameTheProblem"
ctest --output-on-failure -j "${TRAINER_TEST_JOBS:-2}" -LE gpu -E "$skip" "$@"
