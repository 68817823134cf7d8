// Building a drafter from host weights: uploads this rank's shard to the backend.
#pragma once
#include <memory>

#include "drafter/drafter.hpp"
#include "model/weights.hpp"

namespace mtplab::drafter {

/// Uploads `w` (this rank's shard, its plan matching comm's rank and size) and builds the drafter.
/// With options.head_fp8 the FP8 copy of the head shard is made here when `w` lacks it.
std::unique_ptr<MtpDrafter> make_drafter(ops::Backend& be, dist::Communicator* comm,
                                         const model::ModelConfig& cfg, model::MtpWeights& w,
                                         const DrafterOptions& options);

/// Uploads a host tensor into new backend memory.
template <typename T>
ops::Array<T> upload(ops::Backend& be, const model::HostTensor<T>& t) {
  ops::Array<T> a(be, t.data.size());
  if (!t.data.empty()) be.upload(a.data(), t.data.data(), t.bytes());
  return a;
}

/// The block weights of a host MtpWeights shard.
BlockWeights upload_block_weights(ops::Backend& be, const model::MtpWeights& w);
/// The block weights of a host trunk layer shard (the router and experts, or the dense MLP).
BlockWeights upload_block_weights(ops::Backend& be, const model::LayerWeights& w);

}  // namespace mtplab::drafter
