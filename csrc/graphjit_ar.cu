// graphjit custom all-reduce: the host side, an extern "C" API loaded with ctypes.
//
// Every function returns an int status (GJ_OK = 0) and never exits or throws; on failure the
// message is available from gj_ar_last_error() on the same thread until that thread's next
// failing call.  Ownership: the IPC-shared buffers (signal+scratch, staging) are allocated with
// gj_ar_alloc and freed with gj_ar_free by the caller; a context maps the other ranks' buffers,
// owns the device pointer table and closes every mapping it opened in gj_ar_destroy/gj_ar_reset.
//
// Pointer table: slot 0 holds the staging buffers of all ranks (eager calls copy their input
// there).  Every all-reduce launched while the stream is being captured takes the next free slot
// (no lookup by address: ranks must agree on slots by order, and an address seen before on one
// rank may be new on another); its input address is kept in a pending list.  After the capture,
// the caller exchanges the handles from gj_ar_pending_handles between ranks and calls
// gj_ar_register_pending, which fills the slots.  A graph must not be replayed before that (the
// kernel traps on an unfilled slot instead of reading garbage).  gj_ar_reset empties the table.
//
// Two kinds of context: gj_ar_create (one process per rank: the peers' buffers arrive as IPC
// handles and are mapped here; captured inputs are registered by handle with
// gj_ar_pending_handles + gj_ar_register_pending) and gj_ar_create_local (every rank of the world
// in this process: buffers and captured inputs are plain device pointers, gj_ar_register_local).
//
// Bounds checked here, whatever the caller checked: the input against the staging buffer (eager)
// and the scratch buffer (both paths), the pointer table's capacity, 16-byte size and alignment,
// the dtype, world size and algorithm codes, and the captured buffers' extent at registration.

#include <cuda.h>  // enums and types of the driver API only; the entry point is looked up at run time
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "batch_copy.cuh"
#include "custom_all_reduce.cuh"

#define GJ_EXPORT extern "C" __attribute__((visibility("default")))

enum GjStatus : int {
  GJ_OK = 0,
  GJ_ERR_ARGUMENT = 1,     // a null pointer, a bad code, a negative size
  GJ_ERR_CUDA = 2,         // a CUDA call failed (the message names it)
  GJ_ERR_BOUNDS = 3,       // larger than the staging or scratch buffer, or beyond an allocation
  GJ_ERR_TABLE_FULL = 4,   // no free slot in the pointer table
  GJ_ERR_UNSUPPORTED = 5,  // dtype, world size, size or alignment the kernels do not handle
  GJ_ERR_STATE = 6,        // calls in the wrong order (e.g. register with no pending buffers)
};

static constexpr int kAbiVersion = 4;
static constexpr int kHandleBytes = sizeof(cudaIpcMemHandle_t);
static_assert(kHandleBytes == 64, "cudaIpcMemHandle_t is expected to be 64 bytes");

namespace {

thread_local std::string t_last_error;

int fail(int code, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  t_last_error = buf;
  return code;
}

int cuda_fail(cudaError_t e, const char* what) {
  cudaGetLastError();  // clear a non-sticky error so that the next call starts clean
  return fail(GJ_ERR_CUDA, "%s failed: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

#define GJ_CUDA(call, what)                         \
  do {                                              \
    cudaError_t e_ = (call);                        \
    if (e_ != cudaSuccess) return cuda_fail(e_, what); \
  } while (0)

// Make `device` current for the scope of an API call and restore the caller's device after it.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    status_ = cudaGetDevice(&previous_);
    if (status_ == cudaSuccess && previous_ != device_) status_ = cudaSetDevice(device_);
  }
  ~DeviceGuard() {
    if (status_ == cudaSuccess && previous_ != device_) cudaSetDevice(previous_);
  }
  cudaError_t status() const { return status_; }

 private:
  int device_;
  int previous_ = -1;
  cudaError_t status_;
};

#define GJ_DEVICE(dev)                                                    \
  DeviceGuard guard_(dev);                                                \
  if (guard_.status() != cudaSuccess) return cuda_fail(guard_.status(), "selecting the device (cudaGetDevice/cudaSetDevice)")

// cuPointerGetAttribute from the driver, looked up once (the library links no libcuda).
using PointerAttrFn = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);
PointerAttrFn pointer_attr_fn(std::string* why) {
  static std::once_flag once;
  static PointerAttrFn fn = nullptr;
  static std::string error;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* e = dlerror();
      error = std::string("dlopen(libcuda.so.1) failed: ") + (e ? e : "unknown error");
      return;
    }
    fn = reinterpret_cast<PointerAttrFn>(dlsym(lib, "cuPointerGetAttribute"));
    if (fn == nullptr) error = "libcuda.so.1 has no cuPointerGetAttribute";
  });
  if (fn == nullptr && why != nullptr) *why = error;
  return fn;
}

int pointer_attr(const void* ptr, CUpointer_attribute attr, void* out, const char* what) {
  std::string why;
  PointerAttrFn fn = pointer_attr_fn(&why);
  if (fn == nullptr) return fail(GJ_ERR_CUDA, "%s: %s", what, why.c_str());
  CUresult r = fn(out, attr, reinterpret_cast<CUdeviceptr>(ptr));
  if (r != CUDA_SUCCESS) return fail(GJ_ERR_CUDA, "%s: cuPointerGetAttribute(%p) returned CUresult %d", what, ptr, (int)r);
  return GJ_OK;
}

int element_size(int dtype) {
  switch (dtype) {
    case gjar::kFloat32: return 4;
    case gjar::kFloat16: return 2;
    case gjar::kBFloat16: return 2;
    default: return 0;
  }
}

bool world_supported(int world) { return world == 2 || world == 4 || world == 6 || world == 8; }

int choose_algo(int world, long long bytes) {
  // One-shot moves (world-1)*S bytes per rank with one synchronization; two-shot moves
  // 2*(world-1)/world*S with two.  With 2 ranks both move S bytes over the link, but two-shot
  // splits the adds between the ranks and its second half is a plain copy.  Measured on 2 x H200
  // (NV18, 64 blocks, bf16, inside a CUDA graph; benchmarks/results/allreduce_h200x2_tuned.json):
  // one-shot is faster up to 512 KiB (8.1 vs 8.5 us), the two are even at 1-2 MiB, two-shot is
  // faster from 4 MiB (18.5 vs 19.8 us) and by 10% at 64 MiB.  Worlds 4..8: vLLM's published
  // crossovers, not yet measured here (no machine with more than 2 GPUs).
  if (world <= 2) return bytes < (1LL << 20) ? gjar::kOneShot : gjar::kTwoShot;
  if (world <= 4) return bytes < (512LL << 10) ? gjar::kOneShot : gjar::kTwoShot;
  return bytes < (256LL << 10) ? gjar::kOneShot : gjar::kTwoShot;
}

int blocks_for(long long packs, int max_blocks) {
  long long b = (packs + gjar::kThreads - 1) / gjar::kThreads;
  if (b < 1) b = 1;
  if (b > max_blocks) b = max_blocks;
  return static_cast<int>(b);
}

struct Pending {
  const void* ptr;
  long long bytes;
  int slot;
};

struct Context {
  int rank = 0;
  int world = 0;
  int device = 0;
  bool local = false;  // gj_ar_create_local: every rank in this process, no IPC
  size_t scratch_bytes = 0;
  size_t staging_bytes = 0;
  int max_blocks = 64;
  unsigned long long timeout_ns = 0;
  gjar::Signal* signals[gjar::kMaxRanks] = {};
  void* staging[gjar::kMaxRanks] = {};
  std::vector<void*> peer_maps;                        // signal + staging mappings of the peers
  std::unordered_map<std::string, char*> graph_maps;   // handle bytes -> mapped base (captured inputs)
  gjar::RankPtrs* table = nullptr;                      // device, `capacity` slots
  int capacity = 0;
  int next_slot = 1;
  std::vector<Pending> pending;
  int* probe_result = nullptr;                          // device, kMaxRanks ints
  std::mutex mu;
};

Context* as_ctx(void* p) { return static_cast<Context*>(p); }

int close_graph_maps(Context* c) {
  int status = GJ_OK;
  for (auto& kv : c->graph_maps) {
    cudaError_t e = cudaIpcCloseMemHandle(kv.second);
    if (e != cudaSuccess && status == GJ_OK) status = cuda_fail(e, "cudaIpcCloseMemHandle (captured buffer)");
  }
  c->graph_maps.clear();
  return status;
}

template <typename T, int W>
cudaError_t launch_typed(const gjar::Params& p, int algo, int blocks, cudaStream_t stream) {
  if (algo == gjar::kOneShot) {
    gjar::one_shot_kernel<T, W><<<blocks, gjar::kThreads, 0, stream>>>(p);
  } else {
    gjar::two_shot_kernel<T, W><<<blocks, gjar::kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_world(const gjar::Params& p, int world, int algo, int blocks, cudaStream_t stream) {
  switch (world) {
    case 2: return launch_typed<T, 2>(p, algo, blocks, stream);
    case 4: return launch_typed<T, 4>(p, algo, blocks, stream);
    case 6: return launch_typed<T, 6>(p, algo, blocks, stream);
    case 8: return launch_typed<T, 8>(p, algo, blocks, stream);
    default: return cudaErrorInvalidValue;
  }
}

// Load every kernel now.  With lazy module loading (the default since CUDA 12) a kernel is loaded
// at its first launch; if that first launch happened while a stream is being captured, the load
// would run inside the capture.  Asking for a kernel's attributes loads it.
template <typename T, int W>
cudaError_t preload_typed() {
  cudaFuncAttributes a;
  cudaError_t e = cudaFuncGetAttributes(&a, gjar::one_shot_kernel<T, W>);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, gjar::two_shot_kernel<T, W>);
  return e;
}

template <typename T>
cudaError_t preload_worlds() {
  cudaError_t e = preload_typed<T, 2>();
  if (e == cudaSuccess) e = preload_typed<T, 4>();
  if (e == cudaSuccess) e = preload_typed<T, 6>();
  if (e == cudaSuccess) e = preload_typed<T, 8>();
  return e;
}

cudaError_t preload_kernels() {
  cudaFuncAttributes a;
  cudaError_t e = preload_worlds<float>();
  if (e == cudaSuccess) e = preload_worlds<__half>();
  if (e == cudaSuccess) e = preload_worlds<__nv_bfloat16>();
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, gjar::probe_write_kernel);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&a, gjar::probe_read_kernel);
  return e;
}

}  // namespace

// ---- information ------------------------------------------------------------------------------
GJ_EXPORT int gj_ar_abi_version(void) { return kAbiVersion; }

GJ_EXPORT const char* gj_ar_last_error(void) { return t_last_error.c_str(); }

// ---- batch copy (batch_copy.cuh): graphjit's input and output copies around a replay -------------------
// Load the copy kernel on `device` (call it outside any capture, once, before the first gj_copy_batch).
GJ_EXPORT int gj_copy_preload(int device) {
  GJ_DEVICE(device);
  GJ_CUDA(gjcopy::preload(), "loading the batch copy kernel (was the library built for this GPU's architecture?)");
  return GJ_OK;
}

// Copy bytes[i] bytes from srcs[i] to dsts[i] for i < n, on `stream` of `device`, in one launch per 64 entries.
// The caller guarantees the contract of batch_copy.cuh (device memory, dense, no overlap); null arrays, a
// negative count or size, or a null pointer with a non-zero size are refused before anything is launched
// (GJ_ERR_ARGUMENT), as is a call while a CUDA error of earlier work is pending (GJ_ERR_STATE: nothing launched).
GJ_EXPORT int gj_copy_batch(int n, void* const* dsts, const void* const* srcs, const long long* bytes, int device,
                            void* stream) {
  if (n < 0 || (n > 0 && (!dsts || !srcs || !bytes))) return fail(GJ_ERR_ARGUMENT, "gj_copy_batch: bad arguments");
  for (int i = 0; i < n; ++i) {
    if (bytes[i] < 0 || (bytes[i] > 0 && (!dsts[i] || !srcs[i])))
      return fail(GJ_ERR_ARGUMENT, "gj_copy_batch: entry %d: %lld bytes from %p to %p", i, bytes[i], srcs[i], dsts[i]);
  }
  if (n == 0) return GJ_OK;
  GJ_DEVICE(device);
  // An error of earlier work of this library's runtime still pending: launching would report it as ours and clear
  // it.  Leave it, and let the caller copy its own way this time.
  cudaError_t pending = cudaPeekAtLastError();
  if (pending != cudaSuccess)
    return fail(GJ_ERR_STATE, "gj_copy_batch: a CUDA error of earlier work is pending (%s)", cudaGetErrorName(pending));
  GJ_CUDA(gjcopy::launch(n, dsts, srcs, bytes, static_cast<cudaStream_t>(stream)), "the batch copy launch");
  return GJ_OK;
}

// ---- feed nodes: a graph's own input and output copies, their pointers set for each launch ----------------------
//
// A graph captured with a feed node at its start (the caller's inputs into the static inputs) and one at its end (the
// static outputs into the tensors the call returns) is handed each call's pointers by setting those two nodes'
// parameters in the executable graph (cudaGraphExecKernelNodeSetParams) right before launching it: one call into
// this library instead of a framework copy before the replay and one after it.
//
// Memory ordering: the nodes are kernels of the graph like any other.  The in node has no dependencies inside
// the graph and every node captured after it depends on it (it was the first work on the capture stream), so
// every read of a static input sees its copy; the out node was the last work captured on the capture stream,
// which every side stream had joined, so it copies outputs that are complete.  A launch is ordered on `stream`
// after everything enqueued there before it (the producers of the caller's inputs, the allocation of the
// outputs) and before everything after it (whoever reads the outputs).  Setting a node's parameters affects
// the launches made after it only: a launch already enqueued keeps the pointers it was launched with (the
// CUDA runtime's guarantee for updates of an executable graph), so a call's pointers are read by its own
// launch alone and may be reused once it returns, as after any stream-ordered copy.
//
// The table (uint64 words, written by the caller before each call):
//   [0] cudaGraphExec_t  [1] in node  [2] out node  [3] device  [4] n_in  [5] n_out  [6] launch (0: set only)
//   [7] the caller's own (graphjit: a launch was tried since the nodes were last cleared; never read here)
//   then six arrays of kMaxEntries: in dsts, in srcs, in bytes, out dsts, out srcs, out bytes.
//   then, kept by this library: the entries each node was last set to (a count, then dsts, srcs, bytes), so a
//   call whose pointers are those of the call before sets nothing (setting a node costs about as much as half
//   a launch; a decode loop's inputs often come back at the addresses the caching allocator gave the last ones).
// An entry of 0 bytes is skipped; a node with nothing to copy runs one block that copies nothing.
constexpr int kFeedHeader = 8;
constexpr int kFeedLast = 1 + 3 * gjcopy::kMaxEntries;
constexpr int kFeedWords = kFeedHeader + 6 * gjcopy::kMaxEntries + 2 * kFeedLast;

// Set `node` of `exec` to copy the `used` entries of `batch` unless `last` says it already does; `last` then
// records them.
static cudaError_t set_feed_node(cudaGraphExec_t exec, cudaGraphNode_t node, gjcopy::Batch* batch, int used,
                                 long long largest, unsigned long long* last) {
  const int m = gjcopy::kMaxEntries;
  bool same = last[0] == static_cast<unsigned long long>(used) + 1;  // 0: never set
  for (int i = 0; same && i < used; ++i)
    same = last[1 + i] == reinterpret_cast<uintptr_t>(batch->dst[i]) &&
           last[1 + m + i] == reinterpret_cast<uintptr_t>(batch->src[i]) &&
           last[1 + 2 * m + i] == static_cast<unsigned long long>(batch->bytes[i]);
  if (same) return cudaSuccess;
  void* args[1];
  cudaKernelNodeParams p = gjcopy::node_params(batch, args, used, largest);
  cudaError_t e = cudaGraphExecKernelNodeSetParams(exec, node, &p);
  if (e != cudaSuccess) {
    last[0] = 0;  // unknown: set it next time
    return e;
  }
  last[0] = static_cast<unsigned long long>(used) + 1;
  for (int i = 0; i < used; ++i) {
    last[1 + i] = reinterpret_cast<uintptr_t>(batch->dst[i]);
    last[1 + m + i] = reinterpret_cast<uintptr_t>(batch->src[i]);
    last[1 + 2 * m + i] = static_cast<unsigned long long>(batch->bytes[i]);
  }
  return cudaSuccess;
}

// While `stream` is being captured: add a feed node (a batch copy of nothing) and return its handle in *node.
GJ_EXPORT int gj_feed_node(int device, void* stream, void** node) {
  if (node == nullptr) return fail(GJ_ERR_ARGUMENT, "gj_feed_node: null output pointer");
  GJ_DEVICE(device);
  auto s = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  GJ_CUDA(cudaStreamIsCapturing(s, &status), "cudaStreamIsCapturing");
  if (status != cudaStreamCaptureStatusActive) return fail(GJ_ERR_STATE, "gj_feed_node: the stream is not capturing");
  gjcopy::Batch batch{};
  gjcopy::batch_copy_kernel<<<dim3(1, 1), gjcopy::kThreads, 0, s>>>(batch);
  GJ_CUDA(cudaGetLastError(), "adding a feed node to the capture");
  unsigned long long id = 0;
  cudaGraph_t graph = nullptr;
  const cudaGraphNode_t* deps = nullptr;
  size_t ndeps = 0;
#if CUDART_VERSION >= 13000
  const cudaGraphEdgeData* edges = nullptr;
  GJ_CUDA(cudaStreamGetCaptureInfo(s, &status, &id, &graph, &deps, &edges, &ndeps), "cudaStreamGetCaptureInfo");
#else
  GJ_CUDA(cudaStreamGetCaptureInfo_v2(s, &status, &id, &graph, &deps, &ndeps), "cudaStreamGetCaptureInfo_v2");
#endif
  if (ndeps != 1 || deps == nullptr)
    return fail(GJ_ERR_STATE, "gj_feed_node: the capture has %zu tail nodes after the feed node, not 1", ndeps);
  *node = deps[0];
  return GJ_OK;
}

// Set both feed nodes of the graph the table names (see above) and, where the table says so, launch the graph on
// `stream`.  Refuses a bad table (null handles, counts outside [0, kMaxEntries], a negative size, a null pointer
// with a non-zero size: GJ_ERR_ARGUMENT) and a launch while a CUDA error of earlier work is pending (GJ_ERR_STATE),
// before changing anything.
GJ_EXPORT int gj_feed_launch(unsigned long long* table, void* stream) {
  if (table == nullptr) return fail(GJ_ERR_ARGUMENT, "gj_feed_launch: null table");
  auto exec = reinterpret_cast<cudaGraphExec_t>(table[0]);
  auto in_node = reinterpret_cast<cudaGraphNode_t>(table[1]);
  auto out_node = reinterpret_cast<cudaGraphNode_t>(table[2]);
  const int device = static_cast<int>(table[3]);
  const long long n_in = static_cast<long long>(table[4]), n_out = static_cast<long long>(table[5]);
  if (!exec || !in_node || !out_node || n_in < 0 || n_in > gjcopy::kMaxEntries || n_out < 0 ||
      n_out > gjcopy::kMaxEntries)
    return fail(GJ_ERR_ARGUMENT, "gj_feed_launch: bad table (%lld inputs, %lld outputs)", n_in, n_out);
  const int m = gjcopy::kMaxEntries;
  auto ptrs = reinterpret_cast<void* const*>(table + kFeedHeader);
  auto sizes = reinterpret_cast<const long long*>(table + kFeedHeader);
  void* const* in_dst = ptrs;
  const void* const* in_src = ptrs + m;
  const long long* in_bytes = sizes + 2 * m;
  void* const* out_dst = ptrs + 3 * m;
  const void* const* out_src = ptrs + 4 * m;
  const long long* out_bytes = sizes + 5 * m;
  for (int i = 0; i < n_in; ++i)
    if (in_bytes[i] < 0 || (in_bytes[i] > 0 && (!in_dst[i] || !in_src[i])))
      return fail(GJ_ERR_ARGUMENT, "gj_feed_launch: input entry %d: %lld bytes from %p to %p", i, in_bytes[i],
                  in_src[i], in_dst[i]);
  for (int i = 0; i < n_out; ++i)
    if (out_bytes[i] < 0 || (out_bytes[i] > 0 && (!out_dst[i] || !out_src[i])))
      return fail(GJ_ERR_ARGUMENT, "gj_feed_launch: output entry %d: %lld bytes from %p to %p", i, out_bytes[i],
                  out_src[i], out_dst[i]);
  GJ_DEVICE(device);
  if (table[6] != 0) {  // launching would report an error of earlier work as ours and clear it: leave it
    cudaError_t pending = cudaPeekAtLastError();
    if (pending != cudaSuccess)
      return fail(GJ_ERR_STATE, "gj_feed_launch: a CUDA error of earlier work is pending (%s)",
                  cudaGetErrorName(pending));
  }
  unsigned long long* last = table + kFeedHeader + 6 * m;
  gjcopy::Batch in{}, out{};
  long long largest = 0;
  int used = gjcopy::fill(in, static_cast<int>(n_in), in_dst, in_src, in_bytes, &largest);
  GJ_CUDA(set_feed_node(exec, in_node, &in, used, largest, last), "setting the graph's input copies");
  used = gjcopy::fill(out, static_cast<int>(n_out), out_dst, out_src, out_bytes, &largest);
  GJ_CUDA(set_feed_node(exec, out_node, &out, used, largest, last + kFeedLast), "setting the graph's output copies");
  if (table[6] != 0) GJ_CUDA(cudaGraphLaunch(exec, static_cast<cudaStream_t>(stream)), "cudaGraphLaunch");
  return GJ_OK;
}

// The size of a feed table in uint64 words, and the entries each side holds.
GJ_EXPORT int gj_feed_layout(int* words, int* entries, int* header) {
  if (!words || !entries || !header) return fail(GJ_ERR_ARGUMENT, "gj_feed_layout: null output pointer");
  *words = kFeedWords;
  *entries = gjcopy::kMaxEntries;
  *header = kFeedHeader;
  return GJ_OK;
}

GJ_EXPORT int gj_ar_limits(int* max_ranks, int* max_blocks, int* threads, long long* header_bytes, int* handle_bytes) {
  if (!max_ranks || !max_blocks || !threads || !header_bytes || !handle_bytes)
    return fail(GJ_ERR_ARGUMENT, "gj_ar_limits: null output pointer");
  *max_ranks = gjar::kMaxRanks;
  *max_blocks = gjar::kMaxBlocks;
  *threads = gjar::kThreads;
  *header_bytes = static_cast<long long>(gjar::kHeaderBytes);
  *handle_bytes = kHandleBytes;
  return GJ_OK;
}

GJ_EXPORT int gj_ar_choose_algo(int world, long long bytes, int* algo) {
  if (algo == nullptr) return fail(GJ_ERR_ARGUMENT, "gj_ar_choose_algo: null output pointer");
  if (!world_supported(world)) return fail(GJ_ERR_UNSUPPORTED, "world size %d is not supported (2, 4, 6 or 8)", world);
  if (bytes < 0) return fail(GJ_ERR_ARGUMENT, "gj_ar_choose_algo: negative size %lld", bytes);
  *algo = choose_algo(world, bytes);
  return GJ_OK;
}

GJ_EXPORT int gj_ar_device_info(int device, char* pci_bus_id, int len, int* major, int* minor) {
  if (!pci_bus_id || len < 16 || !major || !minor) return fail(GJ_ERR_ARGUMENT, "gj_ar_device_info: bad output buffers");
  GJ_CUDA(cudaDeviceGetPCIBusId(pci_bus_id, len, device), "cudaDeviceGetPCIBusId");
  GJ_CUDA(cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, device), "cudaDeviceGetAttribute(major)");
  GJ_CUDA(cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor, device), "cudaDeviceGetAttribute(minor)");
  return GJ_OK;
}

// Peer access between two devices visible to this process, by PCI bus id (-1 if one is not visible).
GJ_EXPORT int gj_ar_can_access_peer(const char* pci_a, const char* pci_b, int* result) {
  if (!pci_a || !pci_b || !result) return fail(GJ_ERR_ARGUMENT, "gj_ar_can_access_peer: null argument");
  int a = -1, b = -1;
  if (cudaDeviceGetByPCIBusId(&a, pci_a) != cudaSuccess || cudaDeviceGetByPCIBusId(&b, pci_b) != cudaSuccess) {
    cudaGetLastError();
    *result = -1;
    return GJ_OK;
  }
  int can = 0;
  GJ_CUDA(cudaDeviceCanAccessPeer(&can, a, b), "cudaDeviceCanAccessPeer");
  *result = can;
  return GJ_OK;
}

// 1 if `ptr` lies in memory that cudaIpcGetMemHandle can share (not VMM/cuMemCreate memory such
// as PyTorch's expandable segments).  A driver query, safe while a stream is being captured.
GJ_EXPORT int gj_ar_ipc_capable(const void* ptr, int* capable) {
  if (!ptr || !capable) return fail(GJ_ERR_ARGUMENT, "gj_ar_ipc_capable: null argument");
  int value = 0;
  int rc = pointer_attr(ptr, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, &value, "gj_ar_ipc_capable");
  if (rc != GJ_OK) return rc;
  *capable = value ? 1 : 0;
  return GJ_OK;
}

GJ_EXPORT int gj_ar_stream_capturing(void* stream, int* capturing) {
  if (!capturing) return fail(GJ_ERR_ARGUMENT, "gj_ar_stream_capturing: null output pointer");
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  GJ_CUDA(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status), "cudaStreamIsCapturing");
  *capturing = (status == cudaStreamCaptureStatusActive) ? 1 : (status == cudaStreamCaptureStatusNone ? 0 : 2);
  return GJ_OK;
}

// ---- IPC-shared buffers -----------------------------------------------------------------------
GJ_EXPORT int gj_ar_alloc(int device, long long bytes, void** ptr, void* handle) {
  if (!ptr || !handle) return fail(GJ_ERR_ARGUMENT, "gj_ar_alloc: null output pointer");
  if (bytes <= 0 || bytes % gjar::kPackBytes != 0)
    return fail(GJ_ERR_ARGUMENT, "gj_ar_alloc: size %lld is not a positive multiple of 16 bytes", bytes);
  GJ_DEVICE(device);
  void* p = nullptr;
  GJ_CUDA(cudaMalloc(&p, static_cast<size_t>(bytes)), "cudaMalloc");
  cudaError_t e = cudaMemset(p, 0, static_cast<size_t>(bytes));
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaIpcGetMemHandle(static_cast<cudaIpcMemHandle_t*>(handle), p);
  if (e != cudaSuccess) {
    int rc = cuda_fail(e, "gj_ar_alloc (cudaMemset/cudaIpcGetMemHandle)");
    cudaFree(p);
    return rc;
  }
  *ptr = p;
  return GJ_OK;
}

GJ_EXPORT int gj_ar_free(int device, void* ptr) {
  if (!ptr) return GJ_OK;
  GJ_DEVICE(device);
  GJ_CUDA(cudaFree(ptr), "cudaFree");
  return GJ_OK;
}

// ---- contexts ---------------------------------------------------------------------------------
namespace {

// The checks shared by gj_ar_create and gj_ar_create_local (everything but the buffers themselves).
int check_create_args(int rank, int world, long long signal_bytes, long long staging_bytes, int table_capacity,
                      int max_blocks, double timeout_s) {
  if (!world_supported(world)) return fail(GJ_ERR_UNSUPPORTED, "world size %d is not supported (2, 4, 6 or 8)", world);
  if (rank < 0 || rank >= world) return fail(GJ_ERR_ARGUMENT, "rank %d is not in [0, %d)", rank, world);
  if (signal_bytes <= (long long)gjar::kHeaderBytes || (signal_bytes - (long long)gjar::kHeaderBytes) % gjar::kPackBytes)
    return fail(GJ_ERR_ARGUMENT, "signal buffer of %lld bytes: expected %zu header bytes plus a scratch area that is a "
                "positive multiple of 16 bytes", signal_bytes, gjar::kHeaderBytes);
  if (staging_bytes <= 0 || staging_bytes % gjar::kPackBytes)
    return fail(GJ_ERR_ARGUMENT, "staging buffer of %lld bytes: expected a positive multiple of 16", staging_bytes);
  if (table_capacity < 2 || table_capacity > (1 << 24))
    return fail(GJ_ERR_ARGUMENT, "pointer table capacity %d: expected 2 .. 16777216 slots", table_capacity);
  if (max_blocks < 1 || max_blocks > gjar::kMaxBlocks)
    return fail(GJ_ERR_ARGUMENT, "max_blocks %d: expected 1 .. %d", max_blocks, gjar::kMaxBlocks);
  if (!(timeout_s >= 0.0)) return fail(GJ_ERR_ARGUMENT, "timeout %f s: expected >= 0 (0: none)", timeout_s);
  return GJ_OK;
}

Context* new_context(int rank, int world, int device, long long signal_bytes, long long staging_bytes,
                     int table_capacity, int max_blocks, double timeout_s) {
  Context* c = new Context();
  c->rank = rank;
  c->world = world;
  c->device = device;
  c->scratch_bytes = static_cast<size_t>(signal_bytes) - gjar::kHeaderBytes;
  c->staging_bytes = static_cast<size_t>(staging_bytes);
  c->max_blocks = max_blocks;
  c->timeout_ns = static_cast<unsigned long long>(timeout_s * 1e9);
  c->capacity = table_capacity;
  return c;
}

int drop_context(Context* c, int rc) {
  for (void* m : c->peer_maps) cudaIpcCloseMemHandle(m);
  if (c->table) cudaFree(c->table);
  if (c->probe_result) cudaFree(c->probe_result);
  delete c;
  return rc;
}

// The device pointer table (slot 0: every rank's staging buffer) and the probe result; then the
// context is handed out.  On failure the context is dropped.
int finish_context(Context* c, void** ctx_out) {
  const size_t table_bytes = sizeof(gjar::RankPtrs) * static_cast<size_t>(c->capacity);
  cudaError_t e = cudaMalloc(&c->table, table_bytes);
  if (e == cudaSuccess) e = cudaMemset(c->table, 0, table_bytes);
  if (e == cudaSuccess) e = cudaMalloc(&c->probe_result, sizeof(int) * gjar::kMaxRanks);
  if (e == cudaSuccess) {
    gjar::RankPtrs slot0{};
    for (int r = 0; r < c->world; ++r) slot0.ptr[r] = c->staging[r];
    e = cudaMemcpy(c->table, &slot0, sizeof(slot0), cudaMemcpyHostToDevice);
  }
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return drop_context(c, cuda_fail(e, "gj_ar_create (pointer table)"));
  *ctx_out = c;
  return GJ_OK;
}

}  // namespace

// One rank of a world of processes: the peers' signal and staging buffers arrive as IPC handles
// (world * 64 bytes each, rank-major; this rank's entry is ignored) and are mapped here.
GJ_EXPORT int gj_ar_create(int rank, int world, int device, const void* signal_handles, void* own_signal,
                           long long signal_bytes, const void* staging_handles, void* own_staging,
                           long long staging_bytes, int table_capacity, int max_blocks, double timeout_s,
                           void** ctx_out) {
  if (!ctx_out) return fail(GJ_ERR_ARGUMENT, "gj_ar_create: null output pointer");
  *ctx_out = nullptr;
  if (!signal_handles || !staging_handles) return fail(GJ_ERR_ARGUMENT, "gj_ar_create: null handle array");
  int rc = check_create_args(rank, world, signal_bytes, staging_bytes, table_capacity, max_blocks, timeout_s);
  if (rc != GJ_OK) return rc;
  if (!own_signal || !own_staging) return fail(GJ_ERR_ARGUMENT, "gj_ar_create: null buffer of this rank");
  if ((reinterpret_cast<uintptr_t>(own_signal) | reinterpret_cast<uintptr_t>(own_staging)) % 256)
    return fail(GJ_ERR_ARGUMENT, "gj_ar_create: buffers must come from gj_ar_alloc (256-byte aligned)");
  GJ_DEVICE(device);
  GJ_CUDA(preload_kernels(), "loading the all-reduce kernels (was the library built for this GPU's architecture?)");

  Context* c = new_context(rank, world, device, signal_bytes, staging_bytes, table_capacity, max_blocks, timeout_s);
  const char* sig_h = static_cast<const char*>(signal_handles);
  const char* stg_h = static_cast<const char*>(staging_handles);
  for (int r = 0; r < world; ++r) {
    if (r == rank) {
      c->signals[r] = static_cast<gjar::Signal*>(own_signal);
      c->staging[r] = own_staging;
      continue;
    }
    for (int which = 0; which < 2; ++which) {  // 0: signal+scratch, 1: staging
      cudaIpcMemHandle_t h;
      void* p = nullptr;
      std::memcpy(&h, (which == 0 ? sig_h : stg_h) + r * kHandleBytes, kHandleBytes);
      cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) {
        int code = cuda_fail(e, which == 0 ? "cudaIpcOpenMemHandle (signal buffer of a peer)"
                                           : "cudaIpcOpenMemHandle (staging buffer of a peer)");
        t_last_error += " [peer rank " + std::to_string(r) + "]";
        return drop_context(c, code);
      }
      c->peer_maps.push_back(p);
      if (which == 0) {
        c->signals[r] = static_cast<gjar::Signal*>(p);
      } else {
        c->staging[r] = p;
      }
    }
  }
  return finish_context(c, ctx_out);
}

// One rank of a world whose ranks all live in this process (one context per rank): the buffers
// of every rank are given as device pointers (`world` each, from gj_ar_alloc), nothing is mapped.
// Used to run every rank of a world on one GPU, each on its own stream (the kernel tests do this
// to check world sizes 2..8 on a single GPU), or several GPUs of one process with peer access
// enabled.  The ranks' kernels spin on each other's flags, so all ranks of one call must be
// resident at once: keep world * max_blocks within what the GPU(s) can run concurrently, and
// launch every rank's call before any other kernel (with CUDA's lazy module loading, the first
// launch of another kernel may wait for the running ones, and rank 0's would wait for rank 1's).
GJ_EXPORT int gj_ar_create_local(int rank, int world, int device, void* const* signals, void* const* stagings,
                                 long long signal_bytes, long long staging_bytes, int table_capacity, int max_blocks,
                                 double timeout_s, void** ctx_out) {
  if (!ctx_out) return fail(GJ_ERR_ARGUMENT, "gj_ar_create_local: null output pointer");
  *ctx_out = nullptr;
  if (!signals || !stagings) return fail(GJ_ERR_ARGUMENT, "gj_ar_create_local: null buffer array");
  int rc = check_create_args(rank, world, signal_bytes, staging_bytes, table_capacity, max_blocks, timeout_s);
  if (rc != GJ_OK) return rc;
  for (int r = 0; r < world; ++r)
    if (!signals[r] || !stagings[r] || (reinterpret_cast<uintptr_t>(signals[r]) | reinterpret_cast<uintptr_t>(stagings[r])) % 256)
      return fail(GJ_ERR_ARGUMENT, "gj_ar_create_local: buffer of rank %d is null or not from gj_ar_alloc", r);
  GJ_DEVICE(device);
  GJ_CUDA(preload_kernels(), "loading the all-reduce kernels (was the library built for this GPU's architecture?)");
  Context* c = new_context(rank, world, device, signal_bytes, staging_bytes, table_capacity, max_blocks, timeout_s);
  c->local = true;
  for (int r = 0; r < world; ++r) {
    c->signals[r] = static_cast<gjar::Signal*>(signals[r]);
    c->staging[r] = stagings[r];
  }
  return finish_context(c, ctx_out);
}

GJ_EXPORT int gj_ar_destroy(void* ctx) {
  if (!ctx) return GJ_OK;
  Context* c = as_ctx(ctx);
  int status = GJ_OK;
  {
    DeviceGuard guard(c->device);
    cudaDeviceSynchronize();  // no kernel of ours may still use a mapping
    status = close_graph_maps(c);
    for (void* m : c->peer_maps) {
      cudaError_t e = cudaIpcCloseMemHandle(m);
      if (e != cudaSuccess && status == GJ_OK) status = cuda_fail(e, "cudaIpcCloseMemHandle (peer buffer)");
    }
    if (c->table) cudaFree(c->table);
    if (c->probe_result) cudaFree(c->probe_result);
  }
  delete c;
  return status;
}

// ---- the all-reduce ---------------------------------------------------------------------------
// In place when in == out.  Not capturing: `in` is copied into the staging buffer (unless it is
// the staging buffer) and the kernel reads the staging buffers of all ranks (slot 0).  Capturing:
// zero copy; the launch takes the next pointer-table slot, registered after the capture.
GJ_EXPORT int gj_ar_all_reduce(void* ctx, const void* in, void* out, long long numel, int dtype, int algo, void* stream) {
  if (!ctx) return fail(GJ_ERR_ARGUMENT, "gj_ar_all_reduce: null context (collectives.init did not succeed)");
  Context* c = as_ctx(ctx);
  if (!in || !out) return fail(GJ_ERR_ARGUMENT, "gj_ar_all_reduce: null input or output pointer");
  const int esize = element_size(dtype);
  if (esize == 0) return fail(GJ_ERR_UNSUPPORTED, "dtype code %d is not supported (0 float32, 1 float16, 2 bfloat16)", dtype);
  if (numel <= 0) return fail(GJ_ERR_ARGUMENT, "numel %lld: expected > 0", numel);
  if (algo < gjar::kAuto || algo > gjar::kTwoShot) return fail(GJ_ERR_ARGUMENT, "algorithm code %d: expected 0 auto, 1 one-shot, 2 two-shot", algo);
  const long long bytes = numel * esize;
  if (bytes % gjar::kPackBytes) return fail(GJ_ERR_UNSUPPORTED, "%lld bytes is not a multiple of 16", bytes);
  if ((reinterpret_cast<uintptr_t>(in) | reinterpret_cast<uintptr_t>(out)) % gjar::kPackBytes)
    return fail(GJ_ERR_UNSUPPORTED, "input %p or output %p is not 16-byte aligned", in, out);
  const char* ib = static_cast<const char*>(in);
  const char* ob = static_cast<const char*>(out);
  if (ib != ob && ib < ob + bytes && ob < ib + bytes)
    return fail(GJ_ERR_ARGUMENT, "input and output overlap without being the same buffer");
  if (static_cast<unsigned long long>(bytes) > c->scratch_bytes)
    return fail(GJ_ERR_BOUNDS, "%lld bytes exceed the scratch buffer (%zu bytes, max_bytes of collectives.init)",
                bytes, c->scratch_bytes);
  if (algo == gjar::kAuto) algo = choose_algo(c->world, bytes);
  GJ_DEVICE(c->device);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  GJ_CUDA(cudaStreamIsCapturing(s, &capture), "cudaStreamIsCapturing");
  if (capture == cudaStreamCaptureStatusInvalidated)
    return fail(GJ_ERR_CUDA, "the stream's capture was invalidated before the all-reduce");

  gjar::Params p{};
  for (int r = 0; r < c->world; ++r) p.signals[r] = c->signals[r];
  p.out = out;
  p.packs = bytes / gjar::kPackBytes;
  p.rank = c->rank;
  p.timeout_ns = c->timeout_ns;
  if (capture == cudaStreamCaptureStatusActive) {
    std::lock_guard<std::mutex> lock(c->mu);
    if (c->next_slot >= c->capacity)
      return fail(GJ_ERR_TABLE_FULL, "the pointer table is full (%d slots, %d used by captured all-reduces): "
                  "call collectives.reset() after dropping old graphs, or init with more slots",
                  c->capacity, c->next_slot - 1);
    const int slot = c->next_slot++;
    c->pending.push_back(Pending{in, bytes, slot});
    p.inputs = c->table + slot;
    p.inplace = (in == out) ? 1 : 0;
  } else {
    if (static_cast<unsigned long long>(bytes) > c->staging_bytes)
      return fail(GJ_ERR_BOUNDS, "%lld bytes exceed the staging buffer (%zu bytes)", bytes, c->staging_bytes);
    if (in != c->staging[c->rank])
      GJ_CUDA(cudaMemcpyAsync(c->staging[c->rank], in, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, s),
              "cudaMemcpyAsync (input -> staging buffer)");
    p.inputs = c->table;  // slot 0: the staging buffers
    p.inplace = (out == c->staging[c->rank]) ? 1 : 0;
  }
  const long long work = (algo == gjar::kOneShot) ? p.packs : (p.packs + c->world - 1) / c->world;
  const int blocks = blocks_for(work, c->max_blocks);
  cudaError_t e = cudaErrorInvalidValue;
  switch (dtype) {
    case gjar::kFloat32: e = launch_world<float>(p, c->world, algo, blocks, s); break;
    case gjar::kFloat16: e = launch_world<__half>(p, c->world, algo, blocks, s); break;
    case gjar::kBFloat16: e = launch_world<__nv_bfloat16>(p, c->world, algo, blocks, s); break;
  }
  if (e != cudaSuccess) return cuda_fail(e, "all-reduce kernel launch");
  return GJ_OK;
}

// ---- registration of captured inputs -----------------------------------------------------------
namespace {

// Copy the rows of the pending entries into their slots and clear the pending list (c->mu held).
int write_rows(Context* c, const std::vector<gjar::RankPtrs>& rows, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  for (size_t i = 0; i < rows.size(); ++i)
    GJ_CUDA(cudaMemcpyAsync(c->table + c->pending[i].slot, &rows[i], sizeof(gjar::RankPtrs), cudaMemcpyHostToDevice, s),
            "cudaMemcpyAsync (pointer table)");
  GJ_CUDA(cudaStreamSynchronize(s), "cudaStreamSynchronize (pointer table)");
  c->pending.clear();
  return GJ_OK;
}

}  // namespace

GJ_EXPORT int gj_ar_pending(void* ctx, int* count) {
  if (!ctx || !count) return fail(GJ_ERR_ARGUMENT, "gj_ar_pending: null argument");
  Context* c = as_ctx(ctx);
  std::lock_guard<std::mutex> lock(c->mu);
  *count = static_cast<int>(c->pending.size());
  return GJ_OK;
}

GJ_EXPORT int gj_ar_slots(void* ctx, int* used, int* capacity) {
  if (!ctx || !used || !capacity) return fail(GJ_ERR_ARGUMENT, "gj_ar_slots: null argument");
  Context* c = as_ctx(ctx);
  std::lock_guard<std::mutex> lock(c->mu);
  *used = c->next_slot;
  *capacity = c->capacity;
  return GJ_OK;
}

// Forget the first `count` pending entries (captures that failed: their slots stay used until reset).
GJ_EXPORT int gj_ar_drop_pending(void* ctx, int count) {
  if (!ctx) return fail(GJ_ERR_ARGUMENT, "gj_ar_drop_pending: null context");
  Context* c = as_ctx(ctx);
  std::lock_guard<std::mutex> lock(c->mu);
  if (count < 0 || count > static_cast<int>(c->pending.size()))
    return fail(GJ_ERR_ARGUMENT, "gj_ar_drop_pending: %d of %zu pending entries", count, c->pending.size());
  c->pending.erase(c->pending.begin(), c->pending.begin() + count);
  return GJ_OK;
}

// IPC handle of the allocation holding each pending input, and the input's offset in it.
GJ_EXPORT int gj_ar_pending_handles(void* ctx, int count, void* handles, long long* offsets) {
  if (!ctx || (count > 0 && (!handles || !offsets))) return fail(GJ_ERR_ARGUMENT, "gj_ar_pending_handles: null argument");
  Context* c = as_ctx(ctx);
  std::lock_guard<std::mutex> lock(c->mu);
  if (count != static_cast<int>(c->pending.size()))
    return fail(GJ_ERR_STATE, "gj_ar_pending_handles: asked for %d entries, %zu are pending", count, c->pending.size());
  GJ_DEVICE(c->device);
  char* out = static_cast<char*>(handles);
  for (int i = 0; i < count; ++i) {
    const Pending& pe = c->pending[i];
    void* base = nullptr;
    size_t size = 0;
    int capable = 0;
    int rc = pointer_attr(pe.ptr, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, &capable, "captured input");
    if (rc != GJ_OK) return rc;
    if (!capable)
      return fail(GJ_ERR_UNSUPPORTED, "captured all-reduce input %p is in memory that CUDA IPC cannot share "
                  "(VMM memory, e.g. PyTorch expandable_segments)", pe.ptr);
    rc = pointer_attr(pe.ptr, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, &base, "captured input");
    if (rc != GJ_OK) return rc;
    rc = pointer_attr(pe.ptr, CU_POINTER_ATTRIBUTE_RANGE_SIZE, &size, "captured input");
    if (rc != GJ_OK) return rc;
    const long long offset = static_cast<const char*>(pe.ptr) - static_cast<const char*>(base);
    if (offset < 0 || static_cast<unsigned long long>(offset + pe.bytes) > size)
      return fail(GJ_ERR_BOUNDS, "captured all-reduce input %p (%lld bytes) extends beyond its allocation "
                  "(%p, %zu bytes)", pe.ptr, pe.bytes, base, size);
    GJ_CUDA(cudaIpcGetMemHandle(reinterpret_cast<cudaIpcMemHandle_t*>(out + i * kHandleBytes), base),
            "cudaIpcGetMemHandle (captured input)");
    offsets[i] = offset;
  }
  return GJ_OK;
}

// handles: world * count * 64 bytes, rank-major; offsets: world * count.  Fills the slots of the
// pending entries, in order, with the matching entry of every rank, then clears the pending list.
GJ_EXPORT int gj_ar_register_pending(void* ctx, int count, const void* handles, const long long* offsets, void* stream) {
  if (!ctx || (count > 0 && (!handles || !offsets))) return fail(GJ_ERR_ARGUMENT, "gj_ar_register_pending: null argument");
  Context* c = as_ctx(ctx);
  if (c->local)
    return fail(GJ_ERR_STATE, "gj_ar_register_pending: a local context (gj_ar_create_local) registers with "
                "gj_ar_register_local");
  std::lock_guard<std::mutex> lock(c->mu);
  if (count != static_cast<int>(c->pending.size()))
    return fail(GJ_ERR_STATE, "gj_ar_register_pending: %d entries given, %zu pending on rank %d (ranks captured "
                "different all-reduces)", count, c->pending.size(), c->rank);
  GJ_DEVICE(c->device);
  const char* hs = static_cast<const char*>(handles);
  std::vector<gjar::RankPtrs> rows(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    gjar::RankPtrs& row = rows[i];
    std::memset(&row, 0, sizeof(row));
    for (int r = 0; r < c->world; ++r) {
      if (r == c->rank) {
        row.ptr[r] = c->pending[i].ptr;
        continue;
      }
      const long long off = offsets[static_cast<size_t>(r) * count + i];
      if (off < 0) return fail(GJ_ERR_ARGUMENT, "negative offset %lld from rank %d", off, r);
      std::string key(hs + (static_cast<size_t>(r) * count + i) * kHandleBytes, kHandleBytes);
      auto it = c->graph_maps.find(key);
      char* base = nullptr;
      if (it != c->graph_maps.end()) {
        base = it->second;
      } else {
        cudaIpcMemHandle_t h;
        std::memcpy(&h, key.data(), kHandleBytes);
        void* p = nullptr;
        cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess) {
          int rc = cuda_fail(e, "cudaIpcOpenMemHandle (captured input of a peer)");
          t_last_error += " [peer rank " + std::to_string(r) + "]";
          return rc;
        }
        base = static_cast<char*>(p);
        c->graph_maps.emplace(std::move(key), base);
      }
      row.ptr[r] = base + off;
    }
  }
  return write_rows(c, rows, stream);
}

// gj_ar_register_pending for a context of gj_ar_create_local: ptrs holds world * count device
// pointers, rank-major (ptrs[r * count + i]: rank r's i-th captured input); this rank's own row
// must repeat its pending inputs in capture order (a check that the ranks captured alike).
GJ_EXPORT int gj_ar_register_local(void* ctx, int world, int count, const void* const* ptrs, void* stream) {
  if (!ctx || (count > 0 && !ptrs)) return fail(GJ_ERR_ARGUMENT, "gj_ar_register_local: null argument");
  Context* c = as_ctx(ctx);
  if (!c->local)
    return fail(GJ_ERR_STATE, "gj_ar_register_local: the context was made by gj_ar_create (register by IPC handle)");
  if (world != c->world)
    return fail(GJ_ERR_ARGUMENT, "gj_ar_register_local: rows for %d ranks, the world has %d", world, c->world);
  std::lock_guard<std::mutex> lock(c->mu);
  if (count != static_cast<int>(c->pending.size()))
    return fail(GJ_ERR_STATE, "gj_ar_register_local: %d entries given, %zu pending on rank %d (ranks captured "
                "different all-reduces)", count, c->pending.size(), c->rank);
  GJ_DEVICE(c->device);
  std::vector<gjar::RankPtrs> rows(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    std::memset(&rows[i], 0, sizeof(gjar::RankPtrs));
    for (int r = 0; r < c->world; ++r) {
      const void* p = ptrs[static_cast<size_t>(r) * count + i];
      if (p == nullptr || reinterpret_cast<uintptr_t>(p) % gjar::kPackBytes)
        return fail(GJ_ERR_ARGUMENT, "gj_ar_register_local: entry %d of rank %d is null or not 16-byte aligned", i, r);
      if (r == c->rank && p != c->pending[i].ptr)
        return fail(GJ_ERR_STATE, "gj_ar_register_local: entry %d of rank %d is %p, its capture recorded %p", i, r, p,
                    c->pending[i].ptr);
      rows[i].ptr[r] = p;
    }
  }
  return write_rows(c, rows, stream);
}

// Free every captured slot (graphs that used them must not be replayed again) and close the
// mappings of captured inputs.  Slot 0 (staging) stays.
GJ_EXPORT int gj_ar_reset(void* ctx) {
  if (!ctx) return fail(GJ_ERR_ARGUMENT, "gj_ar_reset: null context");
  Context* c = as_ctx(ctx);
  std::lock_guard<std::mutex> lock(c->mu);
  GJ_DEVICE(c->device);
  GJ_CUDA(cudaDeviceSynchronize(), "cudaDeviceSynchronize (reset)");
  if (c->capacity > 1)
    GJ_CUDA(cudaMemset(c->table + 1, 0, sizeof(gjar::RankPtrs) * static_cast<size_t>(c->capacity - 1)),
            "cudaMemset (pointer table)");
  GJ_CUDA(cudaDeviceSynchronize(), "cudaDeviceSynchronize (reset)");
  int rc = close_graph_maps(c);
  c->pending.clear();
  c->next_slot = 1;
  return rc;
}

// ---- probe ------------------------------------------------------------------------------------
namespace {

gjar::ProbeParams probe_params(const Context* c, unsigned token) {
  gjar::ProbeParams p{};
  for (int r = 0; r < c->world; ++r) p.signals[r] = c->signals[r];
  p.rank = c->rank;
  p.world = c->world;
  p.token = token;
  p.result = c->probe_result;
  return p;
}

}  // namespace

GJ_EXPORT int gj_ar_probe_write(void* ctx, unsigned token, void* stream) {
  if (!ctx) return fail(GJ_ERR_ARGUMENT, "gj_ar_probe_write: null context");
  Context* c = as_ctx(ctx);
  GJ_DEVICE(c->device);
  const gjar::ProbeParams p = probe_params(c, token);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  gjar::probe_write_kernel<<<1, 32, 0, s>>>(p);
  GJ_CUDA(cudaGetLastError(), "probe write kernel launch");
  GJ_CUDA(cudaStreamSynchronize(s), "probe write");
  return GJ_OK;
}

// ok_mask: bit r set if rank r's probe value arrived in this rank's buffer.
GJ_EXPORT int gj_ar_probe_check(void* ctx, unsigned token, void* stream, int* ok_mask) {
  if (!ctx || !ok_mask) return fail(GJ_ERR_ARGUMENT, "gj_ar_probe_check: null argument");
  Context* c = as_ctx(ctx);
  GJ_DEVICE(c->device);
  const gjar::ProbeParams p = probe_params(c, token);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  GJ_CUDA(cudaMemsetAsync(c->probe_result, 0, sizeof(int) * gjar::kMaxRanks, s), "cudaMemsetAsync (probe)");
  gjar::probe_read_kernel<<<1, 32, 0, s>>>(p);
  GJ_CUDA(cudaGetLastError(), "probe read kernel launch");
  int host[gjar::kMaxRanks] = {};
  GJ_CUDA(cudaMemcpyAsync(host, c->probe_result, sizeof(host), cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync (probe)");
  GJ_CUDA(cudaStreamSynchronize(s), "probe read");
  int mask = 0;
  for (int r = 0; r < c->world; ++r)
    if (host[r]) mask |= 1 << r;
  *ok_mask = mask;
  return GJ_OK;
}
