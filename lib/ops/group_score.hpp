// The router's group score, shared by the CPU reference (cpu/moe.cpp) and the CUDA router
// (cuda/moe.cu) so that both rank groups by the same arithmetic: the sum of a group's two largest
// biased scores (DeepSeek-V3's group limit), each comparison and the one addition in fp32.
#pragma once
#include <cmath>

#if defined(__CUDACC__)
#define MTP_HOST_DEVICE __host__ __device__
#else
#define MTP_HOST_DEVICE
#endif

namespace mtplab::ops {

/// The sum of the two largest of biased[begin .. end) (at least two values), in fp32.
MTP_HOST_DEVICE inline float group_top2_sum(const float* biased, int begin, int end) {
  float top1 = -INFINITY, top2 = -INFINITY;
  for (int e = begin; e < end; ++e) {
    const float v = biased[e];
    if (v > top1) {
      top2 = top1;
      top1 = v;
    } else if (v > top2) {
      top2 = v;
    }
  }
  return top1 + top2;
}

}  // namespace mtplab::ops

#undef MTP_HOST_DEVICE
