// cuBLASLt GEMMs: the FP8 weight gradient, and the bf16 products of the fast mode (bf16_gemm).
//
// The FP8 weight gradient added by the GEMM itself into its fp32
// accumulator: D += (a_scale b_scale) A B^T through cuBLASLt with beta = 1,
// instead of an fp32 product written out and then added by a second pass
// (LibTorch's scaled GEMM has no beta). Exact accumulation (no fast
// accumulation), as the other backward GEMMs.
//
// cuBLASLt is column-major and takes FP8 operands as "TN" only. The
// row-major D [rows, cols] is the column-major [cols, rows], which is
// op(B') op(A') with m = cols, n = rows, k = inner: the first operand the
// row-major [cols, inner] `b` (column-major [inner, cols], transposed), the
// second the row-major [rows, inner] `a` (column-major [inner, rows]).
#include <cublasLt.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "Kernels.h"

namespace trainer::ops::kernels {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

// The largest power of two (at most 256) dividing the address: cuBLASLt's
// kernels are chosen for the operands' alignment.
uint32_t alignment_of(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 1;
  while (alignment < 256 && address % (alignment * 2) == 0) alignment *= 2;
  return alignment;
}

using AlgoKey = std::tuple<int64_t, int64_t, int64_t, bool, bool, uint32_t, uint32_t, uint32_t>;
// bf16_gemm's: rows, cols, inner, a and b transposed, d fp32, beta nonzero, timed, the three alignments.
using Bf16Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, bool, bool, bool, uint32_t, uint32_t, uint32_t>;

// One per device: the handle, a workspace per stream (kernels on one
// stream run in order, so a call never overlaps the previous one's use),
// and the algorithm cuBLASLt's heuristic chose for each shape (none: the
// shape is not supported; the caller then adds an fp32 product itself).
struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  std::map<cudaStream_t, void*> workspaces;
  std::map<AlgoKey, std::unique_ptr<cublasLtMatmulAlgo_t>> algorithms;
  std::map<Bf16Key, std::unique_ptr<cublasLtMatmulAlgo_t>> bf16_algorithms;
};

std::mutex g_mutex;
std::map<int, DeviceState> g_devices;

struct MatmulDesc {
  cublasLtMatmulDesc_t desc = nullptr;
  ~MatmulDesc() {
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};
struct Layout {
  cublasLtMatrixLayout_t layout = nullptr;
  ~Layout() {
    if (layout != nullptr) cublasLtMatrixLayoutDestroy(layout);
  }
};
struct Preference {
  cublasLtMatmulPreference_t preference = nullptr;
  ~Preference() {
    if (preference != nullptr) cublasLtMatmulPreferenceDestroy(preference);
  }
};

cudaDataType_t fp8_type(bool e5m2) { return e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3; }

// Whether `stream` captures a CUDA graph (or cannot say).
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &status) != cudaSuccess || status != cudaStreamCaptureStatusNone;
}

// The device's state with its handle and `stream`'s workspace (allocated on
// the stream's first call, never while it captures a CUDA graph: an
// allocation would end the capture); nullptr where either is missing.
// With g_mutex held.
DeviceState* device_state(cudaStream_t stream, void** workspace_out) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return nullptr;
  DeviceState& state = g_devices[device];
  if (state.handle == nullptr && cublasLtCreate(&state.handle) != CUBLAS_STATUS_SUCCESS) {
    state.handle = nullptr;
    return nullptr;
  }
  void*& workspace = state.workspaces[stream];
  if (workspace == nullptr) {
    if (capturing(stream)) return nullptr;
    if (cudaMalloc(&workspace, kWorkspaceBytes) != cudaSuccess) {
      workspace = nullptr;
      cudaGetLastError();  // the failed allocation is not the next kernel's error
      return nullptr;
    }
  }
  *workspace_out = workspace;
  return &state;
}

// The algorithms cuBLASLt's heuristic offers for these layouts (`d` also
// C's) within the workspace, for operands of these alignments, best-ranked
// first, at most `limit`; none where it offers none.
std::vector<cublasLtMatmulAlgo_t> ranked_algorithms(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                    cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                    cublasLtMatrixLayout_t d, uint32_t align_a, uint32_t align_b,
                                                    uint32_t align_d, int limit) {
  Preference preference;
  const uint64_t workspace_bytes = kWorkspaceBytes;
  bool set = cublasLtMatmulPreferenceCreate(&preference.preference) == CUBLAS_STATUS_SUCCESS;
  set = set && cublasLtMatmulPreferenceSetAttribute(preference.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &workspace_bytes, sizeof(workspace_bytes)) == CUBLAS_STATUS_SUCCESS;
  set = set && cublasLtMatmulPreferenceSetAttribute(preference.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                    &align_a, sizeof(align_a)) == CUBLAS_STATUS_SUCCESS;
  set = set && cublasLtMatmulPreferenceSetAttribute(preference.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                    &align_b, sizeof(align_b)) == CUBLAS_STATUS_SUCCESS;
  set = set && cublasLtMatmulPreferenceSetAttribute(preference.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                    &align_d, sizeof(align_d)) == CUBLAS_STATUS_SUCCESS;
  set = set && cublasLtMatmulPreferenceSetAttribute(preference.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                    &align_d, sizeof(align_d)) == CUBLAS_STATUS_SUCCESS;
  std::vector<cublasLtMatmulHeuristicResult_t> results(size_t(std::max(limit, 1)));
  int count = 0;
  std::vector<cublasLtMatmulAlgo_t> ranked;
  if (set && cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, d, d, preference.preference, int(results.size()),
                                            results.data(), &count) == CUBLAS_STATUS_SUCCESS) {
    for (int i = 0; i < count; ++i) {
      if (results[size_t(i)].state == CUBLAS_STATUS_SUCCESS) ranked.push_back(results[size_t(i)].algo);
    }
  }
  return ranked;
}

std::unique_ptr<cublasLtMatmulAlgo_t> first_algorithm(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                      cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                      cublasLtMatrixLayout_t d, uint32_t align_a, uint32_t align_b,
                                                      uint32_t align_d) {
  const std::vector<cublasLtMatmulAlgo_t> ranked =
      ranked_algorithms(handle, desc, a, b, d, align_a, align_b, align_d, 1);
  return ranked.empty() ? nullptr : std::make_unique<cublasLtMatmulAlgo_t>(ranked.front());
}

// A fingerprint of the n 16-bit words of x, added into *sum: each word
// mixed with its index (splitmix64's finalizer), summed (any order gives
// the same sum). Two outputs with equal fingerprints hold the same bits
// but for a 2^-64 chance.
__global__ void fingerprint_kernel(const uint16_t* x, int64_t n, unsigned long long* sum) {
  unsigned long long local = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    unsigned long long z = (static_cast<unsigned long long>(i) << 16 | x[i]) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    local += z ^ (z >> 31);
  }
  atomicAdd(sum, local);
}

constexpr int kTimedCandidates = 8;
constexpr int kTimedRepeats = 3;

size_t round_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

size_t output_bytes(const Bf16Gemm& g) { return size_t(g.rows) * size_t(g.cols) * (g.d_fp32 ? 4 : 2); }

// g's descriptors: the row-major product as cuBLASLt's column-major one (see bf16_gemm).
struct Bf16Descriptors {
  MatmulDesc op;
  Layout first, second, out;
};

bool describe(const Bf16Gemm& g, Bf16Descriptors& d) {
  const cublasOperation_t op_b = g.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = g.a_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const uint64_t m = uint64_t(g.cols), n = uint64_t(g.rows), k = uint64_t(g.inner);
  bool ok = cublasLtMatmulDescCreate(&d.op.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatmulDescSetAttribute(d.op.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof(op_b)) ==
                 CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatmulDescSetAttribute(d.op.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof(op_a)) ==
                 CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatrixLayoutCreate(&d.first.layout, CUDA_R_16BF, g.b_transposed ? k : m, g.b_transposed ? m : k,
                                        int64_t(g.b_transposed ? k : m)) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatrixLayoutCreate(&d.second.layout, CUDA_R_16BF, g.a_transposed ? n : k, g.a_transposed ? k : n,
                                        int64_t(g.a_transposed ? n : k)) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatrixLayoutCreate(&d.out.layout, g.d_fp32 ? CUDA_R_32F : CUDA_R_16BF, m, n, int64_t(m)) ==
                 CUBLAS_STATUS_SUCCESS;
  return ok;
}

Bf16Key key_of(const Bf16Gemm& g) {
  return Bf16Key{g.rows,         g.cols,  g.inner,           g.a_transposed,    g.b_transposed,   g.d_fp32,
                 g.beta != 0.0f, g.timed, alignment_of(g.a), alignment_of(g.b), alignment_of(g.d)};
}

cublasStatus_t run_bf16(DeviceState& state, const Bf16Descriptors& d, const Bf16Gemm& g, float beta, const void* c,
                        void* out, const cublasLtMatmulAlgo_t& algo, void* workspace, cudaStream_t stream) {
  const float alpha = 1.0f;
  return cublasLtMatmul(state.handle, d.op.desc, &alpha, g.b, d.first.layout, g.a, d.second.layout, &beta, c,
                        d.out.layout, out, d.out.layout, &algo, workspace, kWorkspaceBytes, stream);
}

// g's output's fingerprint (fingerprint_kernel) read back; false where it could not be.
bool fingerprint(const void* out, size_t bytes, unsigned long long* device_sum, cudaStream_t stream,
                 unsigned long long& host_sum) {
  if (cudaMemsetAsync(device_sum, 0, sizeof(*device_sum), stream) != cudaSuccess) return false;
  const int64_t words = int64_t(bytes / 2);
  const int blocks = int(std::min<int64_t>((words + 255) / 256, 1024));
  fingerprint_kernel<<<blocks, 256, 0, stream>>>(static_cast<const uint16_t*>(out), words, device_sum);
  return cudaMemcpyAsync(&host_sum, device_sum, sizeof(host_sum), cudaMemcpyDeviceToHost, stream) == cudaSuccess &&
         cudaStreamSynchronize(stream) == cudaSuccess;
}

// The scratch a timed g needs: the fingerprint's sum, and where beta reads
// C an output to run the candidates into (C copied from g.d each time); at
// beta 0 they run into g.d itself, which the call then overwrites.
size_t timing_scratch_bytes(const Bf16Gemm& g) { return (g.beta != 0.0f ? round_up(output_bytes(g)) : 0) + 256; }

// Of `ranked` (the first first), the one that runs g's product fastest
// among those whose output has the first's fingerprint for g's operands
// (timing_scratch_bytes says where they run); the first where nothing else
// qualifies, the caller had no scratch or the timing cannot run.
// Synchronizes the stream.
cublasLtMatmulAlgo_t fastest_with_first_bits(DeviceState& state, const Bf16Descriptors& d, const Bf16Gemm& g,
                                             const std::vector<cublasLtMatmulAlgo_t>& ranked, void* workspace,
                                             cudaStream_t stream) {
  const size_t bytes = output_bytes(g);
  if (ranked.size() < 2 || g.scratch == nullptr || g.scratch_bytes < timing_scratch_bytes(g)) return ranked.front();
  const float beta = g.beta;
  void* trial = beta != 0.0f ? g.scratch : g.d;
  auto* device_sum =
      reinterpret_cast<unsigned long long*>(static_cast<char*>(g.scratch) + (beta != 0.0f ? round_up(bytes) : 0));
  const void* c = trial;  // as the call's own C is its D: read only where beta is nonzero
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
    if (start != nullptr) cudaEventDestroy(start);
    cudaGetLastError();
    return ranked.front();
  }
  size_t best = 0;
  float best_ms = 0.0f;
  unsigned long long first_sum = 0;
  for (size_t i = 0; i < ranked.size(); ++i) {
    if (beta != 0.0f && cudaMemcpyAsync(trial, g.d, bytes, cudaMemcpyDeviceToDevice, stream) != cudaSuccess) break;
    unsigned long long sum = 0;
    if (run_bf16(state, d, g, beta, c, trial, ranked[i], workspace, stream) != CUBLAS_STATUS_SUCCESS ||
        !fingerprint(trial, bytes, device_sum, stream, sum)) {
      if (i == 0) break;
      continue;
    }
    if (i == 0) first_sum = sum;
    if (sum != first_sum) continue;
    // Timed into the trial output (what it holds no longer matters).
    bool ran = cudaEventRecord(start, stream) == cudaSuccess;
    for (int r = 0; ran && r < kTimedRepeats; ++r) {
      ran = run_bf16(state, d, g, beta, c, trial, ranked[i], workspace, stream) == CUBLAS_STATUS_SUCCESS;
    }
    float ms = 0.0f;
    if (!ran || cudaEventRecord(stop, stream) != cudaSuccess || cudaEventSynchronize(stop) != cudaSuccess ||
        cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) {
      if (i == 0) break;
      continue;
    }
    if (i == 0 || ms < best_ms) best = i, best_ms = ms;
  }
  cudaStreamSynchronize(stream);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaGetLastError();  // a failed candidate's error is not the next kernel's
  return ranked[best];
}

}  // namespace

GemmResult fp8_gemm_accumulate(const void* a, bool a_e5m2, const float* a_inverse_scale, const void* b, bool b_e5m2,
                               const float* b_inverse_scale, float* d, int64_t rows, int64_t cols, int64_t inner,
                               cudaStream_t stream) {
  if (a_e5m2 && b_e5m2) return GemmResult::unsupported;  // cuBLASLt multiplies no two E5M2 operands
  if (rows <= 0 || cols <= 0 || inner <= 0) return GemmResult::unsupported;
  const std::lock_guard<std::mutex> lock(g_mutex);
  void* workspace = nullptr;
  DeviceState* found_state = device_state(stream, &workspace);
  if (found_state == nullptr) return GemmResult::unsupported;
  DeviceState& state = *found_state;

  // The first operand (op = T) is `b`, the second (op = N) is `a`; see the file's comment.
  MatmulDesc op;
  Layout first, second, out;
  const cublasOperation_t transposed = CUBLAS_OP_T, plain = CUBLAS_OP_N;
  const int8_t exact = 0;  // no fast accumulation (the attribute is an int8_t)
  bool ok = cublasLtMatmulDescCreate(&op.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_TRANSA, &transposed, sizeof(transposed)) ==
                 CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_TRANSB, &plain, sizeof(plain)) ==
                 CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &exact, sizeof(exact)) ==
                 CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_inverse_scale,
                                            sizeof(b_inverse_scale)) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_inverse_scale,
                                            sizeof(a_inverse_scale)) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatrixLayoutCreate(&first.layout, fp8_type(b_e5m2), uint64_t(inner), uint64_t(cols), inner) ==
                 CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatrixLayoutCreate(&second.layout, fp8_type(a_e5m2), uint64_t(inner), uint64_t(rows), inner) ==
                 CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatrixLayoutCreate(&out.layout, CUDA_R_32F, uint64_t(cols), uint64_t(rows), cols) ==
                 CUBLAS_STATUS_SUCCESS;
  if (!ok) return GemmResult::unsupported;

  const AlgoKey key{rows, cols, inner, a_e5m2, b_e5m2, alignment_of(a), alignment_of(b), alignment_of(d)};
  auto found = state.algorithms.find(key);
  if (found == state.algorithms.end()) {
    std::unique_ptr<cublasLtMatmulAlgo_t> chosen =
        first_algorithm(state.handle, op.desc, first.layout, second.layout, out.layout, alignment_of(b),
                        alignment_of(a), alignment_of(d));
    found = state.algorithms.emplace(key, std::move(chosen)).first;
  }
  if (found->second == nullptr) return GemmResult::unsupported;

  const float alpha = 1.0f, beta = 1.0f;
  const cublasStatus_t status =
      cublasLtMatmul(state.handle, op.desc, &alpha, b, first.layout, a, second.layout, &beta, d, out.layout, d,
                     out.layout, found->second.get(), workspace, kWorkspaceBytes, stream);
  return status == CUBLAS_STATUS_SUCCESS ? GemmResult::done : GemmResult::failed;
}

// Row-major d [rows, cols] is column-major [cols, rows] = op(B') op(A'):
// m = cols, n = rows, k = inner. B' is B's storage read column-major: a
// row-major [inner, cols] is column-major [cols, inner] (op N, ld cols); a
// stored transpose [cols, inner] is column-major [inner, cols] (op T, ld
// inner). Likewise A': row-major [rows, inner] is column-major [inner, rows]
// (op N, ld inner); a stored [inner, rows] is column-major [rows, inner] (op T, ld rows).
GemmResult bf16_gemm(const Bf16Gemm& g, cudaStream_t stream) {
  if (g.rows <= 0 || g.cols <= 0 || g.inner <= 0) return GemmResult::unsupported;
  const std::lock_guard<std::mutex> lock(g_mutex);
  void* workspace = nullptr;
  DeviceState* state = device_state(stream, &workspace);
  if (state == nullptr) return GemmResult::unsupported;
  Bf16Descriptors d;
  if (!describe(g, d)) return GemmResult::unsupported;

  const uint32_t align_b = alignment_of(g.b), align_a = alignment_of(g.a), align_d = alignment_of(g.d);
  const Bf16Key key = key_of(g);
  auto found = state->bf16_algorithms.find(key);
  cublasLtMatmulAlgo_t unkept{};  // a timed shape's first while capturing: chosen later
  const cublasLtMatmulAlgo_t* algo = nullptr;
  if (found != state->bf16_algorithms.end()) {
    algo = found->second.get();
  } else {
    const std::vector<cublasLtMatmulAlgo_t> ranked =
        ranked_algorithms(state->handle, d.op.desc, d.first.layout, d.second.layout, d.out.layout, align_b, align_a,
                          align_d, g.timed ? kTimedCandidates : 1);
    if (ranked.empty()) {
      found = state->bf16_algorithms.emplace(key, nullptr).first;
    } else if (!g.timed) {
      found = state->bf16_algorithms.emplace(key, std::make_unique<cublasLtMatmulAlgo_t>(ranked.front())).first;
    } else if (capturing(stream)) {
      unkept = ranked.front();
      algo = &unkept;
    } else {
      const cublasLtMatmulAlgo_t chosen = fastest_with_first_bits(*state, d, g, ranked, workspace, stream);
      found = state->bf16_algorithms.emplace(key, std::make_unique<cublasLtMatmulAlgo_t>(chosen)).first;
    }
    if (algo == nullptr) algo = found->second.get();
  }
  if (algo == nullptr) return GemmResult::unsupported;
  const cublasStatus_t status = run_bf16(*state, d, g, g.beta, g.d, g.d, *algo, workspace, stream);
  return status == CUBLAS_STATUS_SUCCESS ? GemmResult::done : GemmResult::failed;
}

size_t bf16_gemm_scratch_bytes(const Bf16Gemm& g, cudaStream_t stream) {
  if (!g.timed || g.rows <= 0 || g.cols <= 0 || g.inner <= 0 || capturing(stream)) return 0;
  const std::lock_guard<std::mutex> lock(g_mutex);
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  const DeviceState& state = g_devices[device];
  if (state.bf16_algorithms.count(key_of(g)) != 0) return 0;
  return timing_scratch_bytes(g);
}

}  // namespace trainer::ops::kernels
