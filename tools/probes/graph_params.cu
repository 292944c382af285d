// Host cost of handing a replay its pointers by updating one kernel node of the executable graph
// (cudaGraphExecKernelNodeSetParams) against a plain cudaGraphLaunch and a separate kernel launch,
// and a check that a launch after an update reads the new pointers while an earlier launch still
// in the queue keeps the old ones.
// Build and run on the GPU machine: nvcc -O2 -std=c++17 -o /tmp/gp tools/probes/graph_params.cu && /tmp/gp
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#define CK(x)                                                                      \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return 1;                                                                    \
    }                                                                              \
  } while (0)

struct Args {
  const float* src[8];
  float* dst[8];
  int n[8];
  int count;
};

__global__ void gather(const __grid_constant__ Args a) {
  for (int k = 0; k < a.count; ++k)
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < a.n[k]; i += gridDim.x * blockDim.x) a.dst[k][i] = a.src[k][i];
}

__global__ void add1(float* x, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] += 1.0f;
}

static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main() {
  const int n = 8 * 1024, iters = 20000;
  cudaStream_t s;
  CK(cudaSetDevice(0));
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<float*> srcs(16), statics(4);
  for (auto& p : srcs) CK(cudaMalloc(&p, n * sizeof(float)));
  for (auto& p : statics) CK(cudaMalloc(&p, n * sizeof(float)));
  std::vector<float> host(n);
  for (int j = 0; j < 16; ++j) {
    for (int i = 0; i < n; ++i) host[i] = float(j * 100);
    CK(cudaMemcpy(srcs[j], host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  }
  Args a{};
  a.count = 4;
  for (int k = 0; k < 4; ++k) {
    a.src[k] = srcs[k];
    a.dst[k] = statics[k];
    a.n[k] = n;
  }
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  gather<<<8, 256, 0, s>>>(a);
  cudaStreamCaptureStatus st;
  unsigned long long id;
  cudaGraph_t cg;
  const cudaGraphNode_t* deps = nullptr;
  const cudaGraphEdgeData* edges = nullptr;
  size_t ndeps = 0;
  CK(cudaStreamGetCaptureInfo(s, &st, &id, &cg, &deps, &edges, &ndeps));
  if (ndeps != 1) {
    std::printf("expected one dependency, got %zu\n", ndeps);
    return 1;
  }
  cudaGraphNode_t node = deps[0];
  for (int r = 0; r < 3; ++r)
    for (int k = 0; k < 4; ++k) add1<<<8, 256, 0, s>>>(statics[k], n);
  CK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaKernelNodeParams kp{};
  CK(cudaGraphKernelNodeGetParams(node, &kp));
  std::printf("node func matches: %d\n", kp.func == (void*)gather);

  // correctness: launch with sources 0..3, update to 4..7, launch again; the first launch must have read 0..3
  CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(host.data(), statics[1], sizeof(float), cudaMemcpyDeviceToHost));
  std::printf("after launch 1 (src 1 = 100, +3): %.0f\n", host[0]);
  Args b = a;
  for (int k = 0; k < 4; ++k) b.src[k] = srcs[4 + k];
  void* kargs[] = {&b};
  cudaKernelNodeParams np = kp;
  np.kernelParams = kargs;
  // queue a long run of launches with the old pointers, then update and launch once: the queued ones keep theirs
  for (int i = 0; i < 200; ++i) CK(cudaGraphLaunch(ge, s));
  CK(cudaGraphExecKernelNodeSetParams(ge, node, &np));
  CK(cudaGraphLaunch(ge, s));
  CK(cudaStreamSynchronize(s));
  CK(cudaMemcpy(host.data(), statics[1], sizeof(float), cudaMemcpyDeviceToHost));
  std::printf("after update (src 5 = 500, +3): %.0f\n", host[0]);

  auto time = [&](const char* what, auto fn) -> int {
    CK(cudaStreamSynchronize(s));
    double t0 = now_us();
    for (int i = 0; i < iters; ++i)
      if (fn(i)) return 1;
    double t1 = now_us();
    CK(cudaStreamSynchronize(s));
    double t2 = now_us();
    std::printf("%-40s host %.3f us/call, with the GPU %.3f us/call\n", what, (t1 - t0) / iters, (t2 - t0) / iters);
    return 0;
  };
  int rc = 0;
  rc |= time("cudaGraphLaunch", [&](int) { return cudaGraphLaunch(ge, s) != cudaSuccess; });
  rc |= time("SetParams + cudaGraphLaunch", [&](int i) {
    b.src[0] = srcs[(i & 7) + 8];
    return cudaGraphExecKernelNodeSetParams(ge, node, &np) != cudaSuccess || cudaGraphLaunch(ge, s) != cudaSuccess;
  });
  rc |= time("SetParams alone", [&](int i) {
    b.src[0] = srcs[(i & 7) + 8];
    return cudaGraphExecKernelNodeSetParams(ge, node, &np) != cudaSuccess;
  });
  rc |= time("kernel launch (gather) alone", [&](int) {
    gather<<<8, 256, 0, s>>>(a);
    return cudaPeekAtLastError() != cudaSuccess;
  });
  rc |= time("kernel + cudaGraphLaunch + kernel", [&](int) {
    gather<<<8, 256, 0, s>>>(a);
    if (cudaGraphLaunch(ge, s) != cudaSuccess) return true;
    gather<<<8, 256, 0, s>>>(a);
    return cudaPeekAtLastError() != cudaSuccess;
  });
  // the same on a graph of one tiny node, where the host, not the GPU, sets the pace
  cudaGraph_t g1;
  Args t = a;
  t.count = 1;
  t.n[0] = 256;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  gather<<<1, 256, 0, s>>>(t);
  CK(cudaStreamGetCaptureInfo(s, &st, &id, &cg, &deps, &edges, &ndeps));
  cudaGraphNode_t node1 = deps[0];
  CK(cudaStreamEndCapture(s, &g1));
  cudaGraphExec_t ge1;
  CK(cudaGraphInstantiate(&ge1, g1, 0));
  CK(cudaGraphKernelNodeGetParams(node1, &kp));
  void* targs[] = {&t};
  cudaKernelNodeParams tp = kp;
  tp.kernelParams = targs;
  rc |= time("tiny: cudaGraphLaunch", [&](int) { return cudaGraphLaunch(ge1, s) != cudaSuccess; });
  rc |= time("tiny: SetParams (same) + cudaGraphLaunch", [&](int) {
    return cudaGraphExecKernelNodeSetParams(ge1, node1, &tp) != cudaSuccess || cudaGraphLaunch(ge1, s) != cudaSuccess;
  });
  rc |= time("tiny: SetParams (new src) + cudaGraphLaunch", [&](int i) {
    t.src[0] = srcs[(i & 7) + 8];
    return cudaGraphExecKernelNodeSetParams(ge1, node1, &tp) != cudaSuccess || cudaGraphLaunch(ge1, s) != cudaSuccess;
  });
  rc |= time("tiny: 2x SetParams (new src) + cudaGraphLaunch", [&](int i) {
    t.src[0] = srcs[(i & 7) + 8];
    return cudaGraphExecKernelNodeSetParams(ge1, node1, &tp) != cudaSuccess ||
           cudaGraphExecKernelNodeSetParams(ge1, node1, &tp) != cudaSuccess || cudaGraphLaunch(ge1, s) != cudaSuccess;
  });
  // does setting a node wait for the launches of the graph already queued?  A graph of one ~50 us kernel launched
  // 100 times back to back: with an update before each launch the host would take ~50 us a call if it waited.
  {
    cudaGraph_t gs;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    gather<<<1, 256, 0, s>>>(t);
    CK(cudaStreamGetCaptureInfo(s, &st, &id, &cg, &deps, &edges, &ndeps));
    cudaGraphNode_t nodes = deps[0];
    for (int r = 0; r < 40; ++r) add1<<<1, 32, 0, s>>>(statics[0], n);
    CK(cudaStreamEndCapture(s, &gs));
    cudaGraphExec_t ges;
    CK(cudaGraphInstantiate(&ges, gs, 0));
    auto queued = [&](const char* what, bool update) -> int {
      CK(cudaStreamSynchronize(s));
      double t0 = now_us();
      for (int i = 0; i < 100; ++i) {
        if (update) {
          t.src[0] = srcs[(i & 7) + 8];
          CK(cudaGraphExecKernelNodeSetParams(ges, nodes, &tp));
        }
        CK(cudaGraphLaunch(ges, s));
      }
      double t1 = now_us();
      CK(cudaStreamSynchronize(s));
      double t2 = now_us();
      std::printf("%-40s host %.3f us/call, with the GPU %.3f us/call\n", what, (t1 - t0) / 100, (t2 - t0) / 100);
      return 0;
    };
    rc |= queued("long graph: launch", false);
    rc |= queued("long graph: SetParams + launch", true);
  }
  int dev = -1;
  rc |= time("cudaGetDevice", [&](int) { return cudaGetDevice(&dev) != cudaSuccess; });
  std::printf("rc %d\n", rc);
  return rc;
}
