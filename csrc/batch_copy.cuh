// graphjit batch copy: many contiguous device buffers copied in one kernel launch.
//
// What it is for: a graphed call copies the caller's tensors into the graph's static inputs before a
// replay, and a fresh copy of every output after it.  Each framework copy is a launch of its own
// (several microseconds of host time each on a virtualised host); one launch for all of them keeps
// that cost flat in the number of tensors.
//
// Contract (checked by the caller, graphjit/batch_copy.py, once per key where it can and per call
// where it must): every source and destination is device memory of `device`, dense (the bytes
// [ptr, ptr + bytes) are the tensor), and no destination overlaps another destination or any
// source.  Sizes and alignments are arbitrary: an entry whose pointers are both 16-byte aligned is
// copied in 16-byte words with a byte tail, any other in bytes.
//
// Memory ordering: none is needed inside the kernel.  Each entry is a disjoint region, each byte of
// a destination is written by exactly one thread, and no thread reads what another writes.  The
// launch is ordered on the caller's stream like any other kernel there: it sees every write
// enqueued on that stream before it (the producer of a source), and everything enqueued after it
// (the graph replay that reads the static inputs, the caller that reads a fresh output) sees its
// writes.  Work on other streams is ordered by the caller, as for the framework's own copies.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace gjcopy {

constexpr int kMaxEntries = 64;  // per launch: 64 * 24 bytes of parameters, well inside the 4 KiB limit
constexpr int kThreads = 256;
constexpr int kMaxBlocksPerEntry = 128;

struct Batch {
  const uint8_t* src[kMaxEntries];
  uint8_t* dst[kMaxEntries];
  long long bytes[kMaxEntries];
};

// blockIdx.y picks the entry; the blocks along x stride over its bytes.
__global__ void __launch_bounds__(kThreads) batch_copy_kernel(const __grid_constant__ Batch batch) {
  const int e = blockIdx.y;
  const uint8_t* __restrict__ src = batch.src[e];
  uint8_t* __restrict__ dst = batch.dst[e];
  const long long n = batch.bytes[e];
  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  long long done = 0;
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0) {
    const long long words = n >> 4;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (long long i = first; i < words; i += step) d[i] = s[i];
    done = words << 4;
  }
  for (long long i = done + first; i < n; i += step) dst[i] = src[i];
}

// Blocks along x for the largest entry of a launch: enough that each thread moves a few 16-byte words.
inline int blocks_for(long long largest) {
  const long long per_block = static_cast<long long>(kThreads) * 16 * 4;
  long long blocks = (largest + per_block - 1) / per_block;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxBlocksPerEntry) blocks = kMaxBlocksPerEntry;
  return static_cast<int>(blocks);
}

// Fill `batch` with the entries of `n` (at most kMaxEntries) that have bytes to copy; returns how many, and the
// largest size in `largest`.
inline int fill(Batch& batch, int n, void* const* dsts, const void* const* srcs, const long long* bytes,
                long long* largest) {
  int used = 0;
  *largest = 0;
  for (int i = 0; i < n; ++i) {
    if (bytes[i] == 0) continue;
    batch.src[used] = static_cast<const uint8_t*>(srcs[i]);
    batch.dst[used] = static_cast<uint8_t*>(dsts[i]);
    batch.bytes[used] = bytes[i];
    if (bytes[i] > *largest) *largest = bytes[i];
    ++used;
  }
  return used;
}

// The parameters of a kernel node that copies the `used` entries of `batch` (none: one block that copies
// nothing, entry 0 being zero bytes).  `args` holds the argument pointer and must outlive the call that takes
// the parameters (the driver copies the Batch itself then).
inline cudaKernelNodeParams node_params(Batch* batch, void** args, int used, long long largest) {
  cudaKernelNodeParams p{};
  p.func = reinterpret_cast<void*>(batch_copy_kernel);
  p.gridDim = used > 0 ? dim3(blocks_for(largest), used) : dim3(1, 1);
  p.blockDim = dim3(kThreads);
  p.sharedMemBytes = 0;
  args[0] = batch;
  p.kernelParams = args;
  p.extra = nullptr;
  return p;
}

// Launch the copies of `n` entries on `stream`, kMaxEntries at a time; entries of 0 bytes are skipped.
inline cudaError_t launch(int n, void* const* dsts, const void* const* srcs, const long long* bytes,
                          cudaStream_t stream) {
  Batch batch;
  int used = 0;
  long long largest = 0;
  for (int i = 0; i <= n; ++i) {
    if (used == kMaxEntries || (i == n && used > 0)) {
      batch_copy_kernel<<<dim3(blocks_for(largest), used), kThreads, 0, stream>>>(batch);
      cudaError_t e = cudaGetLastError();
      if (e != cudaSuccess) return e;
      used = 0;
      largest = 0;
    }
    if (i == n || bytes[i] == 0) continue;
    batch.src[used] = static_cast<const uint8_t*>(srcs[i]);
    batch.dst[used] = static_cast<uint8_t*>(dsts[i]);
    batch.bytes[used] = bytes[i];
    if (bytes[i] > largest) largest = bytes[i];
    ++used;
  }
  return cudaSuccess;
}

// Load the kernel now (lazy module loading would load it at its first launch, possibly while another
// thread captures a graph).
inline cudaError_t preload() {
  cudaFuncAttributes attr;
  return cudaFuncGetAttributes(&attr, batch_copy_kernel);
}

}  // namespace gjcopy
