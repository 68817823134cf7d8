// What every host launcher of lib/ops/cuda shares: the launch context, the batched launches' row
// limit and the 16-byte alignment check. The launchers themselves are declared per op family, next
// to their kernels and mirroring lib/ops/cpu/ (docs/kernels.md, "Files"): norm.hpp, dense.hpp,
// moe.hpp, indexer.hpp, mla.hpp, sample_stats.hpp and elementwise.hpp. The CudaBackend is their only
// caller: it validates arguments, owns the scratch buffers and the stream, and passes them in.
//
// Invariants of every launcher:
// - It only enqueues on `ctx.stream` and checks the launch; none synchronises or reads device
//   memory on the host, so each op (a step of batched ops too) can be captured into a CUDA graph.
// - Positions, tokens, expert ids, slots and selections are read on the device.
// - A batched op (ops.hpp's "batched rows", B rows per launch) is one launch for all rows (the
//   grouped experts: two, the split MLA decode: two). Slot ops read slot[b] on the device and skip
//   a padded row (slot[b] < 0) entirely: no load of its inputs, no store to its outputs or to any
//   cache. Slots, positions, tokens, selections and expert ids are trusted (a kernel cannot throw);
//   the CPU reference checks them in tests.
// - Rounding points are those of the CPU reference (lib/ops/cpu, docs/numerics.md): fp32
//   accumulation, one BF16 rounding per stated output; only summation order differs (the
//   tensor-core GEMMs sum in the MMA's order).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.hpp"
#include "ops/kernel_policy.hpp"
#include "ops/ops.hpp"

namespace mtplab::ops::cuda {

/// What every launcher reads: the stream, the device's size, the backend's kernel policy (the only
/// source of a launcher's kernel choice) and whether a graph is being recorded.
struct LaunchCtx {
  cudaStream_t stream = nullptr;
  int num_sms = 1;
  /// The backend's kernel choices (Backend::set_kernel_policy).
  KernelPolicy policy;
  /// The device supports programmatic dependent launch (sm_90 and later).
  bool pdl_capable = false;
  /// Set between begin_capture and end_capture.
  bool capturing = false;
  /// Where the launchers note the kernel each op ran (the backend's Backend::kernels_chosen; null:
  /// nothing is noted). dispatch.hpp's record_kernel.
  KernelRecord* record = nullptr;
  /// Launch with programmatic stream serialization (launch.cuh): the next kernel is scheduled
  /// while this one runs and waits at its start for this one's writes. Eager launches only: in a
  /// captured graph it measured slower (docs/kernels.md). policy.pdl = off turns it off.
  bool pdl() const { return policy.pdl && pdl_capable && !capturing; }
};

/// Most rows one skinny-GEMM launch takes (16 column tiles of 8), and one grouped-expert launch
/// with its plan in shared memory (more rows: a wide launch, moe.hpp).
inline constexpr int kMaxBatchRows = 128;
/// Rows of one launch of the cuBLASLt head past kMaxBatchRows rows (dispatch.hpp's head_lt_launch_rows).
inline constexpr int kHeadLtWideRows = 256;

/// The check of a launcher whose kernels load 16-byte vectors of `what` (the GEMV family and the
/// single-row experts).
inline void require_aligned(const char* op, const char* what, const void* p) {
  MTP_REQUIRE(reinterpret_cast<uintptr_t>(p) % 16 == 0, "ops::cuda::", op, ": ", what,
              " is not 16-byte aligned (the GEMV kernels load 16-byte vectors)");
}

}  // namespace mtplab::ops::cuda
