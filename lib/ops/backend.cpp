// Backend-independent pieces of ops: names, and the CUDA factory when mtplab is built without
// CUDA (with CUDA, lib/ops/cuda/ defines make_cuda_backend and cuda_backend_available).
#include "core/error.hpp"
#include "ops/ops.hpp"

namespace mtplab::ops {

const char* to_string(BackendKind kind) {
  switch (kind) {
    case BackendKind::cpu:
      return "cpu";
    case BackendKind::cuda:
      return "cuda";
  }
  return "unknown";
}

#if !defined(MTPLAB_HAVE_CUDA)
std::unique_ptr<Backend> make_cuda_backend(int device) {
  MTP_FAIL("CUDA backend requested (device ", device,
           ") but this mtplab was built without CUDA; rebuild with -DMTPLAB_CUDA=ON or use the cpu backend");
}

bool cuda_backend_available() { return false; }
#endif

}  // namespace mtplab::ops
