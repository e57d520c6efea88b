// How much would choosing cuBLASLt's algorithm by timing buy over its
// heuristic's first choice, for each bf16 GEMM of a bench shape's step? For
// each GEMM (per linear layer: the forward X W^T and the input gradient dY W
// in bf16, the weight gradient G += dY^T X accumulated into fp32 with beta 1;
// the tied head's chunk likewise), up to 32 of the heuristic's algorithms are
// timed (median of 15 calls after 3) on random data; each line gives the
// heuristic's first, the fastest, its split-K count, and whether the fastest
// writes the first's bits (the weight gradient from the same starting G).
// Seconds of device time; the step's profile says what GEMMs weigh.
//
//   nvcc -std=c++17 -O3 -arch=sm_90 -o /tmp/gemm_algo_probe bench/gemm_algo_probe.cu -lcublasLt
//   /tmp/gemm_algo_probe 3b      (or 0.5b)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

__global__ void fill(__nv_bfloat16* out, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    out[i] = __float2bfloat16(((h & 0xffff) / 32768.0f - 1.0f) * scale);
  }
}

template <typename T>
T* device_array(int64_t n) {
  void* p = nullptr;
  if (cudaMalloc(&p, n * sizeof(T)) != cudaSuccess) {
    std::fprintf(stderr, "gemm_algo_probe: out of device memory\n");
    std::exit(1);
  }
  return static_cast<T*>(p);
}

__nv_bfloat16* values(int64_t n, uint32_t seed, float scale) {
  __nv_bfloat16* p = device_array<__nv_bfloat16>(n);
  fill<<<1024, 256>>>(p, n, seed, scale);
  return p;
}

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "gemm_algo_probe: %s failed (status %d)\n", what, int(status));
    std::exit(1);
  }
}

// One column-major GEMM D = alpha op(A) op(B) + beta C with C = D.
struct Gemm {
  const char* name;
  int64_t m, n, k;  // D is m x n (column-major), the reduction is k
  cublasOperation_t trans_a, trans_b;
  const void* a;
  int64_t lda;
  const void* b;
  int64_t ldb;
  void* d;
  cudaDataType_t d_type;
  float beta;
  int count;  // times a step runs it
};

float time_algo(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld, const Gemm& g, const cublasLtMatmulAlgo_t& algo,
                void* workspace, cudaEvent_t start, cudaEvent_t end) {
  const float alpha = 1.0f;
  std::vector<float> times;
  for (int rep = 0; rep < 18; ++rep) {
    cudaEventRecord(start);
    const cublasStatus_t status = cublasLtMatmul(handle, desc, &alpha, g.a, la, g.b, lb, &g.beta, g.d, ld, g.d, ld,
                                                 &algo, workspace, kWorkspaceBytes, nullptr);
    cudaEventRecord(end);
    cudaEventSynchronize(end);
    if (status != CUBLAS_STATUS_SUCCESS) return -1.0f;
    float ms = 0;
    cudaEventElapsedTime(&ms, start, end);
    if (rep >= 3) times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// The bits D holds after one call from a fixed starting D (the weight
// gradient's beta 1 reads it): copied to the host for comparison.
std::vector<uint8_t> result_bits(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                                 cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t ld, const Gemm& g,
                                 const cublasLtMatmulAlgo_t& algo, void* workspace, const void* start_d, size_t bytes) {
  const float alpha = 1.0f;
  cudaMemcpy(g.d, start_d, bytes, cudaMemcpyDeviceToDevice);
  check(cublasLtMatmul(handle, desc, &alpha, g.a, la, g.b, lb, &g.beta, g.d, ld, g.d, ld, &algo, workspace,
                       kWorkspaceBytes, nullptr),
        "cublasLtMatmul");
  std::vector<uint8_t> host(bytes);
  cudaMemcpy(host.data(), g.d, bytes, cudaMemcpyDeviceToHost);
  return host;
}

struct Totals {
  double first_ms = 0, best_ms = 0, flops = 0;
};

void probe(cublasLtHandle_t handle, void* workspace, const Gemm& g, Totals& totals) {
  cublasLtMatmulDesc_t desc = nullptr;
  check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &g.trans_a, sizeof(g.trans_a)), "TRANSA");
  check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &g.trans_b, sizeof(g.trans_b)), "TRANSB");
  const bool ta = g.trans_a == CUBLAS_OP_T, tb = g.trans_b == CUBLAS_OP_T;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  check(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ta ? g.k : g.m, ta ? g.m : g.k, g.lda), "layout A");
  check(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, tb ? g.n : g.k, tb ? g.k : g.n, g.ldb), "layout B");
  check(cublasLtMatrixLayoutCreate(&ld, g.d_type, g.m, g.n, g.m), "layout D");
  cublasLtMatmulPreference_t preference = nullptr;
  check(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
  const uint64_t workspace_bytes = kWorkspaceBytes;
  check(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                             sizeof(workspace_bytes)),
        "MAX_WORKSPACE_BYTES");
  cublasLtMatmulHeuristicResult_t results[32];
  int returned = 0;
  check(cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, ld, ld, preference, 32, results, &returned),
        "cublasLtMatmulAlgoGetHeuristic");

  const size_t bytes = size_t(g.m) * g.n * (g.d_type == CUDA_R_32F ? 4 : 2);
  void* start_d = device_array<uint8_t>(int64_t(bytes));
  cudaMemcpy(start_d, g.d, bytes, cudaMemcpyDeviceToDevice);
  cudaEvent_t start, end;
  cudaEventCreate(&start);
  cudaEventCreate(&end);
  float first = -1, best = -1;
  int best_index = -1, tried = 0;
  for (int i = 0; i < returned; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    const float ms = time_algo(handle, desc, la, lb, ld, g, results[i].algo, workspace, start, end);
    if (ms < 0) continue;
    ++tried;
    if (first < 0) first = ms;
    if (best < 0 || ms < best) best = ms, best_index = i;
  }
  const double flops = 2.0 * g.m * g.n * g.k;
  if (first < 0) {
    std::printf("%-34s no algorithm ran\n", g.name);
  } else {
    int first_index = 0;
    while (results[first_index].state != CUBLAS_STATUS_SUCCESS) ++first_index;
    int32_t split_k = 1;
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&results[best_index].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split_k,
                                         sizeof(split_k), &written);
    const bool same_bits =
        result_bits(handle, desc, la, lb, ld, g, results[first_index].algo, workspace, start_d, bytes) ==
        result_bits(handle, desc, la, lb, ld, g, results[best_index].algo, workspace, start_d, bytes);
    std::printf(
        "%-34s x%-3d %3d algos  first %8.3f ms %5.0f TFLOP/s  best #%-2d %8.3f ms %5.0f TFLOP/s  %+5.1f%%  "
        "split-k %d  %s\n",
        g.name, g.count, tried, first, flops / first / 1e9, best_index, best, flops / best / 1e9,
        100.0 * (first - best) / first, split_k, same_bits ? "same bits" : "OTHER BITS");
    totals.first_ms += first * g.count;
    totals.best_ms += best * g.count;
    totals.flops += flops * g.count;
  }
  cudaMemcpy(g.d, start_d, bytes, cudaMemcpyDeviceToDevice);
  cudaFree(start_d);
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  cublasLtMatmulPreferenceDestroy(preference);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(ld);
  cublasLtMatmulDescDestroy(desc);
}

struct Shape {
  const char* name;
  int64_t hidden, intermediate, layers, heads, kv_heads, vocab;
};

}  // namespace

int main(int argc, char** argv) {
  const Shape shapes[] = {{"0.5b", 896, 4864, 24, 14, 2, 151936}, {"3b", 2048, 11008, 36, 16, 2, 151936}};
  const char* wanted = argc > 1 ? argv[1] : "3b";
  const Shape* s = nullptr;
  for (const Shape& candidate : shapes) {
    if (std::strcmp(candidate.name, wanted) == 0) s = &candidate;
  }
  if (s == nullptr) {
    std::fprintf(stderr, "gemm_algo_probe: shape '%s' is not 0.5b or 3b\n", wanted);
    return 2;
  }
  const int64_t tokens = 4 * 2048;
  const int64_t head_dim = s->hidden / s->heads;
  const int64_t chunk = (int64_t(1) << 30) / (s->vocab * 4);  // ops/LinearCrossEntropy.cpp's fp32 logits chunk
  const int chunks = int((tokens + chunk - 1) / chunk);
  cublasLtHandle_t handle = nullptr;
  check(cublasLtCreate(&handle), "cublasLtCreate");
  void* workspace = device_array<uint8_t>(int64_t(kWorkspaceBytes));
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("%s, shape %s, %lld tokens a micro-batch, cuBLASLt %zu\n", prop.name, s->name, (long long)tokens,
              cublasLtGetVersion());

  struct Linear {
    const char* name;
    int64_t in, out;
    int count;
  };
  const Linear linears[] = {{"q/k/v", s->hidden, s->hidden + 2 * s->kv_heads * head_dim, int(s->layers)},
                            {"o", s->hidden, s->hidden, int(s->layers)},
                            {"gate/up", s->hidden, 2 * s->intermediate, int(s->layers)},
                            {"down", s->intermediate, s->hidden, int(s->layers)},
                            {"head chunk", s->hidden, s->vocab, chunks}};
  Totals totals;
  char names[5][3][64];
  int li = 0;
  for (const Linear& l : linears) {
    const bool head = std::strcmp(l.name, "head chunk") == 0;
    const int64_t rows = head ? chunk : tokens;
    const int64_t k = l.in, n = l.out;
    __nv_bfloat16* x = values(rows * k, 1, 1.0f);
    __nv_bfloat16* w = values(n * k, 2, 0.03f);
    __nv_bfloat16* dy = values(rows * n, 3, 1e-3f);
    void* y = head ? static_cast<void*>(device_array<float>(rows * n)) : device_array<__nv_bfloat16>(rows * n);
    __nv_bfloat16* dx = device_array<__nv_bfloat16>(rows * k);
    float* grad = device_array<float>(n * k);
    cudaMemset(grad, 0, n * k * sizeof(float));
    std::snprintf(names[li][0], 64, "%s forward%s", l.name, head ? " (fp32 out)" : "");
    std::snprintf(names[li][1], 64, "%s dgrad", l.name);
    std::snprintf(names[li][2], 64, "%s wgrad +=fp32", l.name);
    // Row-major Y[rows, n] = X[rows, k] W[n, k]^T is column-major Y^T (n x rows) = op_T(W) X.
    probe(handle, workspace,
          Gemm{names[li][0], n, rows, k, CUBLAS_OP_T, CUBLAS_OP_N, w, k, x, k, y, head ? CUDA_R_32F : CUDA_R_16BF, 0.0f,
               l.count},
          totals);
    // dX[rows, k] = dY[rows, n] W[n, k]: column-major dX^T (k x rows) = W^T (k x n) dY^T (n x rows).
    probe(handle, workspace,
          Gemm{names[li][1], k, rows, n, CUBLAS_OP_N, CUBLAS_OP_N, w, k, dy, n, dx, CUDA_R_16BF, 0.0f, l.count},
          totals);
    // G[n, k] += dY^T X: column-major G^T (k x n) += X^T (k x rows) op_T(dY^T (n x rows)).
    probe(handle, workspace,
          Gemm{names[li][2], k, n, rows, CUBLAS_OP_N, CUBLAS_OP_T, x, k, dy, n, grad, CUDA_R_32F, 1.0f, l.count},
          totals);
    cudaFree(x), cudaFree(w), cudaFree(dy), cudaFree(y), cudaFree(dx), cudaFree(grad);
    ++li;
  }
  std::printf(
      "a step's GEMMs: heuristic's first %.1f ms (%.0f TFLOP/s), fastest %.1f ms (%.0f TFLOP/s): %.1f ms less\n",
      totals.first_ms, totals.flops / totals.first_ms / 1e9, totals.best_ms, totals.flops / totals.best_ms / 1e9,
      totals.first_ms - totals.best_ms);
  const cudaError_t error = cudaDeviceSynchronize();
  if (error != cudaSuccess) {
    std::fprintf(stderr, "gemm_algo_probe: %s\n", cudaGetErrorString(error));
    return 1;
  }
  return 0;
}
