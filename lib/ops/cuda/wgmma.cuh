// Hopper warpgroup MMA (wgmma) helpers of the batched kernels: the fences, the commit / wait of
// the asynchronous groups, the shared-memory matrix descriptor of the canonical no-swizzle layout,
// and wgmma.mma_async m64nNk16 (FP16 in, fp32 accumulate) with A in registers and B in shared
// memory, for N = 16, 32, 64 and 128. These need the sm_90a target (CMAKE_CUDA_ARCHITECTURES 90a,
// the default): MTPLAB_WGMMA is 1 where the device code is compiled for it, 0 elsewhere (the
// functions are then empty and no launcher may pick a kernel that uses them: mtplab_have_wgmma()).
//
// Layouts (PTX ISA, "asynchronous warpgroup-level matrix multiply"):
// - A (64 x 16, registers): warp w of the warpgroup holds rows 16w .. 16w + 15 in the m16n8k16
//   A fragment of mma.sync (4 words a lane: rows g and g + 8, k 2t .. 2t + 1 and 2t + 8 .. 2t + 9).
// - D (64 x N, fp32): warp w's rows again, N / 8 tiles of the m16n8 accumulator layout, tile j in
//   d[4j .. 4j + 3].
// - B (16 x N, K-major, no swizzle): core matrices of 8 N-rows x 8 K-values, 16 bytes a row, 128
//   contiguous bytes each; the two K-halves of a k-step LBO bytes apart, neighbouring groups of 8
//   N-rows SBO bytes apart.
#pragma once
#include <cstdint>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MTPLAB_WGMMA 1
#else
#define MTPLAB_WGMMA 0
#endif

namespace mtplab::ops::cuda::wg {

/// The descriptor of a no-swizzle K-major operand at shared address `smem` (16-byte aligned).
__device__ __forceinline__ uint64_t desc(const void* smem, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return static_cast<uint64_t>((a >> 4) & 0x3fffu) |
         (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3fffu) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3fffu) << 32);
}

/// Orders this thread's register writes (A fragments, accumulators) before the next wgmma.
__device__ __forceinline__ void fence() {
#if MTPLAB_WGMMA
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
/// Makes this thread's generic-proxy writes to shared memory (cp.async included, once waited for)
/// visible to the async proxy that wgmma reads B through.
__device__ __forceinline__ void fence_proxy_shared() {
#if MTPLAB_WGMMA
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
__device__ __forceinline__ void commit() {
#if MTPLAB_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}
/// Waits until at most N of the warpgroup's committed wgmma groups are pending.
template <int N>
__device__ __forceinline__ void wait() {
#if MTPLAB_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}
/// Keeps the compiler from moving accumulator reads or writes across a wait (the registers are
/// written asynchronously).
template <int kN>
__device__ __forceinline__ void fence_acc(float* d) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

/// d (N / 2 floats a thread) += A (4 words) x B (descriptor), N in {16, 32, 64, 128}.
template <int kN>
__device__ __forceinline__ void mma_f16(float* d, const uint32_t (&a)[4], uint64_t b);

template <>
__device__ __forceinline__ void mma_f16<16>(float* d, const uint32_t (&a)[4], uint64_t b) {
#if MTPLAB_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7}, "
      "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
#endif
}

template <>
__device__ __forceinline__ void mma_f16<32>(float* d, const uint32_t (&a)[4], uint64_t b) {
#if MTPLAB_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
#endif
}

template <>
__device__ __forceinline__ void mma_f16<64>(float* d, const uint32_t (&a)[4], uint64_t b) {
#if MTPLAB_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
#endif
}

template <>
__device__ __forceinline__ void mma_f16<128>(float* d, const uint32_t (&a)[4], uint64_t b) {
#if MTPLAB_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1));
#endif
}

}  // namespace mtplab::ops::cuda::wg
