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

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

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
// bf16_gemm's: rows, cols, inner, a and b transposed, d fp32, beta nonzero, the three alignments.
using Bf16Key = std::tuple<int64_t, int64_t, int64_t, bool, bool, bool, bool, uint32_t, uint32_t, uint32_t>;

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
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capturing) != cudaSuccess || capturing != cudaStreamCaptureStatusNone) {
      return nullptr;
    }
    if (cudaMalloc(&workspace, kWorkspaceBytes) != cudaSuccess) {
      workspace = nullptr;
      cudaGetLastError();  // the failed allocation is not the next kernel's error
      return nullptr;
    }
  }
  *workspace_out = workspace;
  return &state;
}

// The algorithm cuBLASLt's heuristic ranks first for these layouts (`d`
// also C's) within the workspace, for operands of these alignments; nullptr
// where it offers none.
std::unique_ptr<cublasLtMatmulAlgo_t> first_algorithm(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                      cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                      cublasLtMatrixLayout_t d, uint32_t align_a, uint32_t align_b,
                                                      uint32_t align_d) {
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
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  if (set &&
      cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, d, d, preference.preference, 1, &result, &count) ==
          CUBLAS_STATUS_SUCCESS &&
      count > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
    return std::make_unique<cublasLtMatmulAlgo_t>(result.algo);
  }
  return nullptr;
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

  MatmulDesc op;
  Layout first, second, out;
  const cublasOperation_t op_b = g.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = g.a_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const uint64_t m = uint64_t(g.cols), n = uint64_t(g.rows), k = uint64_t(g.inner);
  bool ok = cublasLtMatmulDescCreate(&op.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof(op_b)) ==
                 CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatmulDescSetAttribute(op.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof(op_a)) ==
                 CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatrixLayoutCreate(&first.layout, CUDA_R_16BF, g.b_transposed ? k : m, g.b_transposed ? m : k,
                                        int64_t(g.b_transposed ? k : m)) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatrixLayoutCreate(&second.layout, CUDA_R_16BF, g.a_transposed ? n : k, g.a_transposed ? k : n,
                                        int64_t(g.a_transposed ? n : k)) == CUBLAS_STATUS_SUCCESS;
  ok = ok && cublasLtMatrixLayoutCreate(&out.layout, g.d_fp32 ? CUDA_R_32F : CUDA_R_16BF, m, n, int64_t(m)) ==
                 CUBLAS_STATUS_SUCCESS;
  if (!ok) return GemmResult::unsupported;

  const uint32_t align_b = alignment_of(g.b), align_a = alignment_of(g.a), align_d = alignment_of(g.d);
  const Bf16Key key{g.rows,   g.cols,         g.inner, g.a_transposed, g.b_transposed,
                    g.d_fp32, g.beta != 0.0f, align_a, align_b,        align_d};
  auto found = state->bf16_algorithms.find(key);
  if (found == state->bf16_algorithms.end()) {
    std::unique_ptr<cublasLtMatmulAlgo_t> chosen =
        first_algorithm(state->handle, op.desc, first.layout, second.layout, out.layout, align_b, align_a, align_d);
    found = state->bf16_algorithms.emplace(key, std::move(chosen)).first;
  }
  if (found->second == nullptr) return GemmResult::unsupported;

  const float alpha = 1.0f, beta = g.beta;
  const cublasStatus_t status =
      cublasLtMatmul(state->handle, op.desc, &alpha, g.b, first.layout, g.a, second.layout, &beta, g.d, out.layout, g.d,
                     out.layout, found->second.get(), workspace, kWorkspaceBytes, stream);
  return status == CUBLAS_STATUS_SUCCESS ? GemmResult::done : GemmResult::failed;
}

}  // namespace trainer::ops::kernels
