// graphjit custom all-reduce: the device side.
//
// One process per GPU, 2/4/6/8 GPUs of one node, every rank's buffers mapped into every other
// rank's address space (CUDA IPC).  Two algorithms:
//
//   one-shot  every rank reads the whole input of every rank and writes the whole sum.
//             Reads (world - 1) * S bytes over the links; one round trip of synchronization.
//             Best for small tensors (latency bound).
//   two-shot  rank r reduces only partition r of the tensor into its scratch buffer
//             (reduce-scatter), the ranks synchronize, and every rank copies all partitions from
//             the scratch buffers of all ranks (all-gather).  Reads 2 * (world - 1) / world * S
//             bytes over the links; two rounds of synchronization.  Best for large tensors.
//
// Data moves in 16-byte packs (one 128-bit load or store per thread per pack); sums are
// accumulated in fp32 and rounded once; ranks are always added in rank order 0, 1, ..., world-1,
// so every rank gets bitwise identical results, and one-shot and two-shot give the same bits.
//
// ---------------------------------------------------------------------------------------------
// Synchronization protocol (why it is correct on every CUDA graph replay)
// ---------------------------------------------------------------------------------------------
//
// Every rank owns one `Signal` block at the start of its IPC-shared signal+scratch buffer:
//
//   start[b][p]  written by rank p (remotely, through its mapping of our buffer), read by us:
//                "block b of rank p has entered barrier number e" (e is the value written).
//   end[b][p]    the same for the second barrier of a call.
//   epoch[b]     written and read only by this rank: how many barriers block b has passed.
//
// A barrier is per thread block, not per grid: block b of rank r waits only for block b of the
// other ranks.  That is enough because every rank launches the same grid for the same call and
// the mapping from packs to blocks is identical on every rank and in both halves of a call, so
// the data block b reads on the other ranks was produced (or consumed) by their block b.
//
// The flags are counters, not booleans, and the kernel advances them itself: block b reads
// epoch[b] (say E) from device memory when it starts, uses E+1 for the first barrier and E+2
// for the second, and writes E+2 back when it is done.  Nothing that changes from call to call
// is a kernel argument: the arguments (buffer addresses, the pointer-table slot, the rank) are
// the same at every replay, and the counters live in device memory that the kernel itself
// updates.  So a graph that captured one launch synchronizes correctly on its 1st and its
// 10,000th replay, interleaved with eager calls and other graphs in any order.  (A flag value
// chosen on the host and passed as an argument would be frozen into the graph at capture: the
// second replay would find the flag already set and read stale data.)  Flags are compared for
// equality, so the 32-bit counters may wrap.
//
// Why two arrays (start and end) and not one: a rank can be at most one barrier ahead of a
// slower peer.  Suppose one array were used for both barriers.  Rank A passes barrier e (it saw
// everyone's e) and immediately writes e+1 into B's slot; B, still spinning on barrier e, may
// never see the value e in that slot because it was overwritten with e+1 before B looked: a
// deadlock.  With separate arrays the slot a rank writes next (end) is not the slot its peers
// may still be waiting on (start), and a rank cannot write the *next* start value before every
// peer has passed the current end barrier, because it has to pass that barrier itself first.
// So each slot only ever goes from its previous value to the next one after its reader has seen
// the previous one.
//
// Invariant the buffers rely on: when block b of rank r has passed the start barrier of call k,
// every other rank has started call k, and therefore (stream order) has finished every kernel
// before it, including all blocks of call k-1.  That makes scratch buffers safe to reuse at the
// start of a call without a third barrier.
//
// ---------------------------------------------------------------------------------------------
// Memory ordering (PTX memory model, .sys scope: the other GPUs are the other observers)
// ---------------------------------------------------------------------------------------------
//
// start barrier   store: st.release.sys   poll: ld.acquire.sys
//     The input of this call was written by kernels (or, for eager calls, by the copy into the
//     staging buffer) that ran before this kernel on this rank's stream.  Peers are about to
//     read that input over NVLink/PCIe.  The release store publishes it: a peer that observes
//     the flag with an acquire load also observes every write ordered before the release,
//     including the earlier kernels' writes (stream order puts them before this kernel, and the
//     release is cumulative).  A relaxed flag would give no such guarantee (and has been reported
//     to expose stale input on fast upstream paths), so graphjit pays for one fence per block
//     per call here.
//
// two-shot middle barrier   store: st.release.sys   poll: ld.acquire.sys
//     Between the reduce-scatter and the all-gather.  The release makes this block's partial
//     sums (written to our scratch by all threads of the block, joined by __syncthreads before
//     the store) visible to the peers' block b before they copy them; the acquire on our side
//     does the same for theirs.  It also orders the peers' reads of our input (stage 1) before
//     we overwrite it in stage 2 when the all-reduce is in place.
//
// one-shot final barrier, out of place   store: st.relaxed.sys   poll: ld.relaxed.sys
//     No data is published here: the barrier only keeps a rank from leaving the kernel (and so
//     from letting later kernels overwrite its input) while a peer still reads that input.  The
//     hazard is write-after-read, the reads whose completion we signal have already returned
//     (their values were consumed by the stores to the output before __syncthreads), and the
//     writes we must hold back come from later kernels (a kernel boundary after our poll).  So
//     relaxed system-scope accesses are enough, and the fence is saved on the common path.
//
// one-shot final barrier, in place   store: st.release.sys   poll: ld.acquire.sys
//     In place, the sums go to our scratch first and are copied over our input right after the
//     barrier, inside the same kernel: the overwrite follows the poll directly, so the formal
//     release/acquire pair orders the peers' reads of our input before our writes.
//
// Data loads from other ranks use ld.global.cg (cache in L2, not L1): L1 is not coherent with
// writes made by other GPUs during this kernel, and the data is read once.
//
// The counters (epoch) are written only by their own rank and read by the next launch: the
// kernel boundary orders them; they need no special ordering.
//
// Watchdog: a barrier that waits longer than `timeout_ns` (global timer) prints which rank it
// waited for and traps (the process gets a CUDA error instead of hanging forever).  That happens
// when ranks ran different sequences of collectives.

#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 700)
#error "graphjit's custom all-reduce needs sm_70 or newer (release/acquire at system scope)"
#endif

namespace gjar {

constexpr int kMaxRanks = 8;
constexpr int kMaxBlocks = 64;
constexpr int kThreads = 512;
constexpr int kPackBytes = 16;
constexpr size_t kHeaderBytes = 8192;  // the Signal block; the scratch area starts here

enum DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };
enum Algo : int { kAuto = 0, kOneShot = 1, kTwoShot = 2 };

struct Signal {
  alignas(128) uint32_t start[kMaxBlocks][kMaxRanks];
  alignas(128) uint32_t end[kMaxBlocks][kMaxRanks];
  alignas(128) uint32_t epoch[kMaxBlocks];
  alignas(128) uint32_t probe[kMaxRanks];
};
static_assert(sizeof(Signal) <= kHeaderBytes, "Signal does not fit its header");

// One slot of the pointer table: the address of the same logical buffer on every rank.
struct alignas(16) RankPtrs {
  const void* ptr[kMaxRanks];
};

struct Params {
  const RankPtrs* inputs;      // slot of the device pointer table, read when the kernel runs
  Signal* signals[kMaxRanks];  // every rank's signal+scratch buffer, mapped here
  void* out;                   // this rank's output (may be this rank's input: in place)
  int64_t packs;               // number of 16-byte packs
  int rank;
  int inplace;
  unsigned long long timeout_ns;  // 0: wait forever
};

// p.signals[r] for a run-time r without dynamic indexing of the parameter array (which would copy
// the whole Params struct to local memory in every thread).
template <int W>
__device__ __forceinline__ Signal* signal_of(const Params& p, int r) {
  Signal* s = p.signals[0];
#pragma unroll
  for (int i = 1; i < W; ++i)
    if (i == r) s = p.signals[i];
  return s;
}

__device__ __forceinline__ uint4* scratch_of(Signal* s) {
  return reinterpret_cast<uint4*>(reinterpret_cast<char*>(s) + kHeaderBytes);
}

// ---- flags ----------------------------------------------------------------------------------
__device__ __forceinline__ void st_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t ld_relaxed_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

template <bool kAcquire>
__device__ __noinline__ void wait_flag(const uint32_t* slot, uint32_t want, unsigned long long timeout_ns, int rank,
                                       int peer, bool end) {
  unsigned long long t0 = 0;
  for (uint32_t spin = 1;; ++spin) {
    const uint32_t seen = kAcquire ? ld_acquire_sys(slot) : ld_relaxed_sys(slot);
    if (seen == want) return;
    if (timeout_ns != 0 && (spin & 1023u) == 0) {
      const unsigned long long now = global_timer_ns();
      if (t0 == 0) {
        t0 = now;
      } else if (now - t0 > timeout_ns) {
        printf("graphjit all-reduce: rank %d block %d waited %.0f s at the %s barrier for rank %d "
               "(expected flag %u, found %u): the ranks did not run the same collectives\n",
               rank, static_cast<int>(blockIdx.x), (now - t0) * 1e-9, end ? "end" : "start", peer, want, seen);
        __trap();
      }
    }
  }
}

// Threads 0..W-1 of the block each signal one rank and wait for that rank's signal.  The caller
// brackets the call with __syncthreads() where the block's other threads must be ordered.
template <int W, bool kEnd, bool kOrdered>
__device__ __forceinline__ void cross_rank_barrier(const Params& p, uint32_t flag) {
  if (threadIdx.x < W) {
    const int peer = threadIdx.x;
    Signal* remote = signal_of<W>(p, peer);
    Signal* self = signal_of<W>(p, p.rank);
    uint32_t* out_slot = kEnd ? &remote->end[blockIdx.x][p.rank] : &remote->start[blockIdx.x][p.rank];
    const uint32_t* in_slot = kEnd ? &self->end[blockIdx.x][peer] : &self->start[blockIdx.x][peer];
    if (kOrdered) {
      st_release_sys(out_slot, flag);
    } else {
      st_relaxed_sys(out_slot, flag);
    }
    wait_flag<kOrdered>(in_slot, flag, p.timeout_ns, p.rank, peer, kEnd);
  }
}

// ---- 16-byte packs, fp32 accumulation ----------------------------------------------------------
template <typename T>
struct Elem;
template <>
struct Elem<float> {
  static __device__ __forceinline__ float up(float x) { return x; }
  static __device__ __forceinline__ float down(float x) { return x; }
};
template <>
struct Elem<__half> {
  static __device__ __forceinline__ float up(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half down(float x) { return __float2half_rn(x); }
};
template <>
struct Elem<__nv_bfloat16> {
  static __device__ __forceinline__ float up(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 down(float x) { return __float2bfloat16_rn(x); }
};

__device__ __forceinline__ uint4 ld_peer(const uint4* p) { return __ldcg(p); }

// Packs each thread keeps in flight per loop iteration.  One 16-byte load per thread and
// iteration leaves too few bytes in flight to cover the latency of a read over NVLink (about
// 36 blocks x 512 threads x 16 B = 288 KiB per round trip): the loops below issue kUnroll packs'
// loads (from every rank) before the first add.  The register budget (launch bounds 512 x 1: at
// most 128 registers a thread) caps W x kUnroll at 8 packs of 4 registers.
template <int W>
struct Unroll {
  static constexpr int value = W <= 2 ? 4 : (W <= 4 ? 2 : 1);
};

// Sum of W packs (one per rank, in rank order) in fp32, rounded once.
template <typename T, int W>
__device__ __forceinline__ uint4 sum_packs(const uint4 (&raw)[W]) {
  constexpr int N = kPackBytes / sizeof(T);
  float acc[N];
#pragma unroll
  for (int r = 0; r < W; ++r) {
    T vals[N];
    __builtin_memcpy(vals, &raw[r], kPackBytes);
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = (r == 0) ? Elem<T>::up(vals[i]) : acc[i] + Elem<T>::up(vals[i]);
  }
  T outv[N];
#pragma unroll
  for (int i = 0; i < N; ++i) outv[i] = Elem<T>::down(acc[i]);
  uint4 packed;
  __builtin_memcpy(&packed, outv, kPackBytes);
  return packed;
}

// dst[j] = sum over ranks of in.ptr[r][base + j], for this thread's j in [0, len): j = first,
// first + stride, ...  The set of j a thread (and so a block) handles depends only on first and
// stride, never on the unrolling: the pack -> block mapping the barriers rely on is unchanged.
template <typename T, int W>
__device__ __forceinline__ void reduce_strided(const RankPtrs& in, int64_t base, uint4* dst, int64_t len,
                                               int64_t first, int64_t stride) {
  constexpr int U = Unroll<W>::value;
  const uint4* src[W];
#pragma unroll
  for (int r = 0; r < W; ++r) src[r] = static_cast<const uint4*>(in.ptr[r]) + base;
  int64_t j = first;
  for (; j + (U - 1) * stride < len; j += U * stride) {
    uint4 raw[U][W];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < W; ++r) raw[u][r] = ld_peer(src[r] + j + u * stride);
#pragma unroll
    for (int u = 0; u < U; ++u) dst[j + u * stride] = sum_packs<T, W>(raw[u]);
  }
  for (; j < len; j += stride) {
    uint4 raw[W];
#pragma unroll
    for (int r = 0; r < W; ++r) raw[r] = ld_peer(src[r] + j);
    dst[j] = sum_packs<T, W>(raw);
  }
}

// dst[j] = src[j] for this thread's j in [0, len), kU loads in flight.
template <int U>
__device__ __forceinline__ void copy_strided(const uint4* src, uint4* dst, int64_t len, int64_t first, int64_t stride) {
  int64_t j = first;
  for (; j + (U - 1) * stride < len; j += U * stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = ld_peer(src + j + u * stride);
#pragma unroll
    for (int u = 0; u < U; ++u) dst[j + u * stride] = v[u];
  }
  for (; j < len; j += stride) dst[j] = ld_peer(src + j);
}

template <int W>
__device__ __forceinline__ void check_slot(const RankPtrs& in, const Params& p) {
  if (threadIdx.x == 0) {
    bool missing = false;
#pragma unroll
    for (int r = 0; r < W; ++r) missing |= (in.ptr[r] == nullptr);
    if (missing) {
      printf("graphjit all-reduce: rank %d ran a captured all-reduce whose buffers are not registered "
             "(a graph replayed before graphjit registered its all-reduces on every rank, or after "
             "collectives.reset())\n", p.rank);
      __trap();
    }
  }
}

// ---- kernels -----------------------------------------------------------------------------------
template <typename T, int W>
__global__ void __launch_bounds__(kThreads, 1) one_shot_kernel(Params p) {
  const RankPtrs in = *p.inputs;
  check_slot<W>(in, p);
  Signal* self = signal_of<W>(p, p.rank);
  const uint32_t epoch = self->epoch[blockIdx.x];

  cross_rank_barrier<W, false, true>(p, epoch + 1);  // publish our input, see theirs
  __syncthreads();

  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (!p.inplace) {
    reduce_strided<T, W>(in, 0, static_cast<uint4*>(p.out), p.packs, first, stride);
    __syncthreads();
    cross_rank_barrier<W, true, false>(p, epoch + 2);  // write-after-read guard only: relaxed
  } else {
    uint4* tmp = scratch_of(self);
    reduce_strided<T, W>(in, 0, tmp, p.packs, first, stride);
    __syncthreads();
    cross_rank_barrier<W, true, true>(p, epoch + 2);  // peers are done reading our input
    __syncthreads();
    copy_strided<Unroll<W>::value>(tmp, static_cast<uint4*>(p.out), p.packs, first, stride);
  }
  if (threadIdx.x == 0) self->epoch[blockIdx.x] = epoch + 2;
}

template <typename T, int W>
__global__ void __launch_bounds__(kThreads, 1) two_shot_kernel(Params p) {
  const RankPtrs in = *p.inputs;
  check_slot<W>(in, p);
  Signal* self = signal_of<W>(p, p.rank);
  const uint32_t epoch = self->epoch[blockIdx.x];
  const int64_t part = p.packs / W;  // the last rank's partition also takes the remainder
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;

  cross_rank_barrier<W, false, true>(p, epoch + 1);
  __syncthreads();

  // Stage 1 (reduce-scatter): our partition, summed over all ranks, into our scratch.
  {
    const int64_t base = part * p.rank;
    const int64_t len = (p.rank == W - 1) ? p.packs - base : part;
    reduce_strided<T, W>(in, base, scratch_of(self), len, first, stride);
  }
  __syncthreads();
  cross_rank_barrier<W, true, true>(p, epoch + 2);  // publish partial sums, see everyone's
  __syncthreads();

  // Stage 2 (all-gather): every partition from its owner's scratch.  Same j -> block mapping as
  // stage 1, so block b reads only what the other ranks' block b wrote before the barrier.
  uint4* out = static_cast<uint4*>(p.out);
#pragma unroll
  for (int k = 0; k < W; ++k) {
    const int q = (p.rank + k) % W;  // start with our own partition, then spread over the links
    const int64_t base = part * q;
    const int64_t len = (q == W - 1) ? p.packs - base : part;
    copy_strided<4>(scratch_of(signal_of<W>(p, q)), out + base, len, first, stride);
  }
  if (threadIdx.x == 0) self->epoch[blockIdx.x] = epoch + 2;
}

// Write-and-verify probe of the peer mappings.  Each rank writes a value derived from `token`
// and its rank into slot `rank` of every rank's probe array (through the IPC mappings); after a
// host-side barrier, each rank checks that its own array holds every rank's value.
struct ProbeParams {
  Signal* signals[kMaxRanks];
  int rank;
  int world;
  uint32_t token;
  int* result;  // device, kMaxRanks ints: 1 if rank i's value arrived
};

__host__ __device__ __forceinline__ uint32_t probe_value(uint32_t token, int rank) {
  return (token * 2654435761u) ^ (0x5bd1e995u * static_cast<uint32_t>(rank + 1)) ^ 0x80000000u;
}

__global__ void probe_write_kernel(ProbeParams p) {
  if (threadIdx.x < p.world) st_release_sys(&p.signals[threadIdx.x]->probe[p.rank], probe_value(p.token, p.rank));
}

__global__ void probe_read_kernel(ProbeParams p) {
  if (threadIdx.x < p.world) {
    const uint32_t seen = ld_acquire_sys(&p.signals[p.rank]->probe[threadIdx.x]);
    p.result[threadIdx.x] = (seen == probe_value(p.token, threadIdx.x)) ? 1 : 0;
  }
}

}  // namespace gjar
