// The op set the drafter is written against, and the memory it runs in.
//
// A Backend owns one stream of work: on the CPU it runs each op at once; on CUDA it enqueues
// kernels on its stream and returns. Pointers passed to ops are backend memory (host memory for
// the CPU backend, device memory for CUDA) obtained from allocate(); the drafter never
// dereferences them and never includes a CUDA header.
//
// Invariants every implementation keeps (docs/numerics.md has the full list):
// - BF16 in and out between ops; products accumulate in fp32; norms, router, indexer scores and
//   softmax in fp32; results are rounded to BF16 (round-to-nearest-even) at the points named
//   here, so the CPU reference and the GPU differ only by summation order.
// - Anything that depends on the current position reads it from backend memory (`const int32_t*
//   pos`), so one captured CUDA graph serves every step.
// - Argmax ties go to the lowest index, on every backend and sharding.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/error.hpp"
#include "core/numeric.hpp"
#include "ops/kernel_policy.hpp"
#include "ops/kernel_record.hpp"

namespace mtplab::ops {

enum class BackendKind { cpu, cuda };
const char* to_string(BackendKind kind);

/// Local (max, argmax) of a logit sweep. `index` is already global (base added); ties keep the
/// lowest index. 8 bytes, laid out identically on host and device.
struct ArgMax {
  float value;
  int32_t index;
};

/// Optional outputs of head_argmax beside its (max, index): `key` the pair's packed_u64 key
/// (exactly argmax_pack_key of it), `token` its index as the draft token (exactly argmax_pick of
/// the one pair). Null: not written.
struct HeadExtras {
  uint64_t* key = nullptr;
  int32_t* token = nullptr;
};
static_assert(sizeof(ArgMax) == 8);

/// The latent KV cache of one layer: [num_blocks, block_size, kv_lora] rows, BF16 or FP8 E4M3
/// with one fp32 scale for the whole cache (value = fp8 * scale).
enum class KvDtype { bf16, fp8 };
struct KvCache {
  void* data = nullptr;
  KvDtype dtype = KvDtype::bf16;
  float scale = 1.0f;
  int num_blocks = 0;
  int block_size = 0;
  int kv_lora = 0;
};

/// Stacked expert weights of the experts this rank owns: expert e (local index) has
/// gate [I, H] at gate + e*I*H, up [I, H] at up + e*I*H, down [H, I] at down + e*H*I.
struct ExpertWeights {
  const bf16* gate = nullptr;
  const bf16* up = nullptr;
  const bf16* down = nullptr;
  int first_expert = 0;  ///< global id of local expert 0
  int num_local = 0;
  int hidden = 0;
  int inter = 0;
};

/// How a batch of rows goes through a linear layer: one GEMV per row, or one GEMM for all rows
/// (cuBLASLt on CUDA). They sum in different orders; the `batch_qidx` arm compares them.
enum class RowsMode { per_row, batched };

/// One output of linear_group: y = W x with W [n_out, k] row-major BF16 and the group's shared
/// x [k]. BF16 y is rounded once (as `linear`); fp32 y is not rounded (as `linear_f32`), then
/// multiplied by `f32_scale` in fp32 (as `linear_f32` followed by `scale_f32`; 1 is exact).
struct LinearOut {
  const bf16* W = nullptr;
  void* y = nullptr;
  int n_out = 0;
  bool f32_out = false;
  float f32_scale = 1.0f;  ///< fp32 outputs only; a BF16 output with a scale != 1 is refused
};
/// Most outputs one linear_group takes.
inline constexpr int kMaxLinearGroup = 8;

// ---- ragged rows: a batch of rows over the caches of a pool of sequence slots ----------------
//
// Every forward is one batch of rows (docs/drafter.md, "Ragged rows"): one draft row, one row for
// each of B sequences (a decode batch), n rows of one sequence (prefill, catch-up), B sequences of
// k + 1 rows (the target's verification). Per row: the slot whose caches it uses, and its position,
// which is also the cache row it writes. A sequence's rows are consecutive in the batch and in
// ascending position; a row sees its sequence's cached rows and the batch's earlier rows of its
// sequence (positions <= its own, which the ops that write caches store before any op reads them),
// and nothing of another slot. Everything that varies per step is backend memory, so one recorded
// graph per shape serves every step; the caches of every slot live in one allocation per kind,
// addressed by (slot, position), so one launch reaches every row's caches. slot[b] < 0 marks a
// padded row (a batch padded up to its graph's bucket): it reads nothing and writes nothing.
//
// A tree of draft rows (each row seeing its ancestors only) adds a per-row parent here; the rows a
// row attends to then follow its parents instead of its position, on the same ops.

/// A batch of ragged rows as the ops see it. `max_seq_rows` is a host-side bound the CUDA dispatch
/// reads: the most live rows of one slot in the batch (1: every live row has its own slot, as in a
/// decode batch, so cache writes of different rows never meet).
struct RowBatch {
  const int32_t* slot = nullptr;  ///< [rows], backend memory; < 0: a padded row
  const int32_t* pos = nullptr;   ///< [rows], backend memory (ops that need no position accept null)
  int rows = 0;
  int max_seq_rows = 1;
};

/// The paged latent KV caches of a pool of slots: one block pool shared by all of them (`cache`,
/// num_blocks counting every slot's blocks) and one block table of `max_blocks` entries per slot.
/// Row t of slot s lives in physical block block_tables[s * max_blocks + t / block_size], at
/// t % block_size inside it, exactly as kv_write addresses one sequence through its own table.
struct KvSlots {
  KvCache cache;
  const int32_t* block_tables = nullptr;  ///< [slots, max_blocks], backend memory
  int slots = 0;
  int max_blocks = 0;
};

/// The indexer caches of a pool of slots, slot-major: slot s's arrays are the single-sequence
/// arrays of indexer_store at these offsets (k_cache + s * max_rows * D, valid + s * max_rows,
/// pool_keys + s * max_pools() * D, ...).
struct IndexerSlots {
  bf16* k_cache = nullptr;      ///< [slots, max_rows, D]
  float* gate_cache = nullptr;  ///< [slots, max_rows, D]
  uint8_t* valid = nullptr;     ///< [slots, max_rows]
  float* pool_keys = nullptr;   ///< [slots, max_rows / P, D]
  int slots = 0;
  int max_rows = 0;  ///< rows per slot, a whole number of pools
  int D = 0;
  int P = 0;
  int max_pools() const { return P > 0 ? max_rows / P : 0; }
};

// ---- sampling statistics: the distribution a verifier reads from the head's logits -------------
//
// Sampling verification (docs/drafter.md, "Sampling statistics") needs, per row of logits, the
// distribution q = softmax(transform(l)): divide by the temperature T, keep the top_k largest
// logits (0: off), then the smallest set of largest ones whose mass reaches top_p (1: off), and
// renormalise. Ties at a threshold are kept: every entry whose logit equals the k-th largest is in
// the top-k set, and every entry whose logit equals the value at which the mass reaches top_p is
// in the top-p set, so the support is always {l >= tau} for one logit value tau. The transform
// does not reorder logits (T > 0), so tau is a raw BF16 logit value. Mass is computed with the
// row's max subtracted: count x exp of each distinct logit in fp64, on both backends.

/// The transform's parameters in backend memory, read by the ops when they run (one recorded
/// graph serves every value): temperature > 0, top_k >= 0 (0: off), 0 < top_p <= 1 (1: off).
struct SampleParams {
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  int32_t reserved = 0;
};
static_assert(sizeof(SampleParams) == 16);

/// One row's logits summarised over a shard of the vocab (or the whole row): what the verifier's
/// numbers are combined from (logit_stats_combine). 16 bytes, identical on host and device.
struct LogitStats {
  float max;        ///< largest logit
  float second;     ///< second largest of the multiset (== max on a tie; -inf with one entry)
  float sum;        ///< sum over the kept entries (l >= tau) of exp((l - max) / T)
  float requested;  ///< the requested token's logit when it is in the row's range and kept; else -inf
};
static_assert(sizeof(LogitStats) == 16);

/// What a verifier reads per row (drafter::DraftStats has the same fields).
struct TokenStats {
  float margin;       ///< top-1 minus top-2 raw logit
  float logprob;      ///< log q of the top-1 token (the draft): -log(sum), as the max is kept
  float req_logprob;  ///< log q of the requested token; -inf when it is outside the support
};
static_assert(sizeof(TokenStats) == 12);

/// Segment s of `segments` equal-as-possible parts of [0, vocab): the first vocab % segments parts
/// hold one token more (the rule of model::split_range, which the vocab-sharded head follows).
struct VocabSegment {
  int64_t begin = 0;
  int64_t count = 0;
};
MTP_HD constexpr VocabSegment vocab_segment(int64_t vocab, int segments, int s) {
  const int64_t base = vocab / segments, extra = vocab % segments;
  return VocabSegment{s * base + (s < extra ? s : extra), base + (s < extra ? 1 : 0)};
}

/// A 16-bit key whose unsigned order is the order of BF16 values (-0 keyed as +0, so equal values
/// have equal keys): the stats ops find thresholds on these keys (NaN is outside the contract).
MTP_HD constexpr uint16_t logit_key(uint16_t bits) {
  if ((bits & 0x7fffu) == 0) bits = 0;
  return static_cast<uint16_t>((bits & 0x8000u) ? ~bits : (bits | 0x8000u));
}
/// The BF16 bits of a key (the inverse of logit_key on canonical values).
MTP_HD constexpr uint16_t logit_of_key(uint16_t key) {
  return static_cast<uint16_t>((key & 0x8000u) ? (key & 0x7fffu) : ~key);
}

/// Where the logits of `rows` rows lie in backend memory. One segment (segments == 1): row b's n
/// entries at data + b * ld are the tokens index_base .. index_base + n - 1 (a shard, or the whole
/// vocab). Several (a vocab-sharded head's logits all-gathered, rank-major): segment s of row b at
/// data + s * seg_stride + b * ld holds the tokens of vocab_segment(vocab, segments, s); the
/// entries past a segment's count (padding) are not read.
struct LogitRows {
  const bf16* data = nullptr;
  int rows = 0;
  int ld = 0;
  int n = 0;
  int64_t index_base = 0;
  int segments = 1;
  int64_t seg_stride = 0;
  int64_t vocab = 0;
};

class Event {
 public:
  virtual ~Event() = default;
  virtual void record() = 0;
};

/// A recorded sequence of ops (a CUDA graph executable), replayed on the backend's stream by
/// launch(). Its device pointers and host scalars are those seen while recording; values read
/// from backend memory (positions, tokens) are read afresh at every launch. A graph that recorded
/// NCCL collectives must be destroyed before the communicator (dist/collectives.hpp). The kernels
/// are those of the backend's kernel policy while recording: launching a graph after the policy
/// changed is refused with an Error (record it again under the new policy). A graph must not
/// outlive the backend that recorded it.
class Graph {
 public:
  virtual ~Graph() = default;
  virtual void launch() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;
  /// "cpu" or the device's name.
  virtual std::string device_name() const = 0;

  // ---- memory ---------------------------------------------------------------------------------
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* ptr) noexcept = 0;
  /// Host -> backend; the host buffer may be reused when the call returns.
  virtual void upload(void* dst, const void* host_src, size_t bytes) = 0;
  /// Backend -> host; waits for the work that produces `src`.
  virtual void download(void* host_dst, const void* src, size_t bytes) = 0;
  /// Backend -> backend, in stream order.
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill_bytes(void* dst, uint8_t value, size_t bytes) = 0;
  /// Waits until all enqueued work is done.
  virtual void synchronize() = 0;
  /// The native stream (cudaStream_t) for communicators; nullptr on the CPU.
  virtual void* native_stream() { return nullptr; }

  // ---- kernel choices -------------------------------------------------------------------------
  /// The kernel choices of the ops that follow (ops/kernel_policy.hpp). CUDA: every launcher reads
  /// its choice from the backend's launch context, nothing from the process; the CPU reference
  /// stores the policy and computes the same function under any. Default: KernelPolicy{} (what runs
  /// with nothing configured). A field outside its choices is an Error naming it.
  /// Rule: set the policy before recording a graph. The CUDA backend refuses a change while a
  /// capture is open, and a graph recorded under one policy refuses to launch under another, so a
  /// point never replays another point's kernels (the drafter is rebuilt, and its graphs recorded
  /// again, per point). Not while another thread enqueues ops on this backend.
  virtual void set_kernel_policy(const KernelPolicy& policy) = 0;
  virtual const KernelPolicy& kernel_policy() const = 0;
  /// Which kernel each op ran since reset_kernels_chosen() (ops/kernel_record.hpp): the CUDA
  /// backend notes every choice of its dispatch rules (lib/ops/cuda/dispatch.cu) as it launches
  /// (or records into a graph); the CPU reference, one implementation per op, notes "cpu" under
  /// each of those ops it runs. For the record of a point beside its policy (the results'
  /// `kernels`): reset at the point's start, read at its end. Plain members: a backend fills
  /// kernels_chosen_.
  const KernelRecord& kernels_chosen() const { return kernels_chosen_; }
  void reset_kernels_chosen() { kernels_chosen_.clear(); }

  // ---- timing ---------------------------------------------------------------------------------
  /// CUDA events on the GPU, steady clock on the CPU.
  virtual std::unique_ptr<Event> make_event() = 0;
  /// Milliseconds between two recorded events; waits for `end`.
  virtual double elapsed_ms(const Event& start, const Event& end) = 0;

  /// Kernels enqueued so far by this backend's kind in this process (CUDA: every launch of the
  /// ops' own kernels, counted when enqueued or recorded into a graph, not when a graph replays;
  /// cuBLASLt and NCCL kernels are not counted). 0 on the CPU. For benchmarks.
  virtual uint64_t kernels_enqueued() const { return 0; }

  // ---- graphs (CUDA only; the CPU runs every op at once and has none) -------------------------
  virtual bool supports_graphs() const { return false; }
  /// From here until end_capture() the ops (and collectives on native_stream()) are recorded, not
  /// run. Nothing that synchronises may be called meanwhile (upload, download, synchronize,
  /// elapsed_ms, a scratch growth): the CUDA backend refuses it with an Error.
  virtual void begin_capture() { MTP_FAIL("ops: backend ", to_string(kind()), " cannot record graphs"); }
  /// Ends the recording and instantiates it. The recorded work has NOT run: launch() it.
  virtual std::unique_ptr<Graph> end_capture() {
    MTP_FAIL("ops: backend ", to_string(kind()), " cannot record graphs");
  }

  // ---- small device-side scalars --------------------------------------------------------------
  /// dst[0] = src[0] + add.
  virtual void add_i32(const int32_t* src, int32_t add, int32_t* dst) = 0;

  // ---- norms ----------------------------------------------------------------------------------
  /// y[r] = bf16(w * x[r] / sqrt(mean(x[r]^2) + eps)), fp32 inside. x and y may alias.
  virtual void rmsnorm(const bf16* x, const bf16* w, bf16* y, int rows, int n, float eps) = 0;
  // embed_rmsnorm: what embed_rmsnorm_batch computes per row (ops::OneRow calls it on one row):
  // As rmsnorm, on row `token[0]` of `table` [vocab, n] (the token is read from backend memory).
  /// y[r] = bf16((x[r] - mean) / sqrt(var + eps) * w + b), fp32 inside, biased variance.
  virtual void layernorm(const bf16* x, const bf16* w, const bf16* b, bf16* y, int rows, int n,
                         float eps) = 0;

  // ---- linear layers: y = W x with W [n_out, k] row-major BF16 -------------------------------
  /// X [rows, k] -> Y [rows, n_out], fp32 accumulate, BF16 out. Y must not overlap X. On the CPU
  /// `batched` computes exactly what `per_row` does (the mode only picks the GPU path).
  virtual void linear(const bf16* W, const bf16* X, bf16* Y, int rows, int n_out, int k,
                      RowsMode mode = RowsMode::per_row) = 0;
  /// As linear, fp32 out (no rounding): indexer queries, router logits, row-parallel partials.
  virtual void linear_f32(const bf16* W, const bf16* X, float* Y, int rows, int n_out, int k,
                          RowsMode mode = RowsMode::per_row) = 0;
  // linear_group: what linear_rows_group computes per row (ops::OneRow calls it on one row):
  // Several projections of the same x [k] in one op (one launch on CUDA): each outs[i].y is
  // bit-identical to the separate linear / linear_f32 (+ scale_f32) call with rows = 1 on the
  // same backend. 1 .. kMaxLinearGroup outputs; no y may overlap x or another y.
  /// Several batched projections of the same X [rows, k] in one op: each outs[i].y [rows, n_out] is
  /// bit-identical to the separate linear / linear_f32 (+ scale_f32 over its rows x n_out values)
  /// call with these rows and RowsMode::batched on the same backend. On CUDA the outputs that the
  /// multi-row GEMV takes share one launch (at one row: linear_group's launch). 1 .. kMaxLinearGroup
  /// outputs; no y may overlap X or another y.
  virtual void linear_rows_group(std::span<const LinearOut> outs, const bf16* X, int rows, int k) = 0;
  /// FP8 E4M3 weights with one fp32 scale per output row: y[i] = bf16(scale[i] * sum_j W[i,j] x[j]).
  virtual void linear_fp8(const fp8e4m3* W, const float* row_scale, const bf16* X, bf16* Y, int rows,
                          int n_out, int k) = 0;

  /// The draft head: logits = W x over the rows [0, n) of this rank's shard (BF16 W, or FP8 W
  /// with row scales when W_fp8 is given), logits rounded to BF16, then the (max, argmax) with
  /// `index_base` added. `logits` may be null when the caller does not need them. `extras`: what
  /// the op also writes from the pair, when given (on CUDA the head's last block, no launch more).
  virtual void head_argmax(const bf16* W, const fp8e4m3* W_fp8, const float* row_scale, const bf16* x, int n,
                           int k, int64_t index_base, bf16* logits, ArgMax* out, HeadExtras extras = {}) = 0;
  /// Argmax of BF16 values; ties to the lowest index; `index_base` added to the index.
  virtual void argmax(const bf16* x, int n, int64_t index_base, ArgMax* out) = 0;

  // ---- cross-rank pick helpers (the communication itself lives in dist) ------------------------
  /// Order-preserving 64-bit key: high 32 bits from the value, low 32 bits ~index, so that a MAX
  /// reduction picks the largest value and, among equal values, the lowest index. -0 is keyed
  /// as +0 (they compare equal); NaN is outside the contract (docs/numerics.md).
  virtual void argmax_pack_key(const ArgMax* in, uint64_t* key) = 0;
  virtual void argmax_unpack_key(const uint64_t* key, int32_t* token) = 0;
  /// Pick among `n` (max, index) pairs: largest value, lowest index on ties.
  virtual void argmax_pick(const ArgMax* pairs, int n, int32_t* token) = 0;

  // ---- elementwise ----------------------------------------------------------------------------
  /// y = bf16(x + delta) (the residual add after a row-parallel, all-reduced fp32 partial).
  virtual void residual_add(const bf16* x, const float* delta, bf16* y, int n) = 0;
  // residual_add_rmsnorm: what residual_add_rmsnorm_rows computes per row (ops::OneRow calls it on one row):
  // y = bf16(x + delta), then normed = rmsnorm(y; w, eps): exactly residual_add followed by
  // rmsnorm (bit-identical to the two ops on the same backend), in one op. x and y may alias;
  // normed must overlap neither.
  /// y = bf16(a + b).
  virtual void add(const bf16* a, const bf16* b, bf16* y, int n) = 0;
  /// y[i] = bf16(x[i]) (fp32 -> BF16).
  virtual void to_bf16(const float* x, bf16* y, int n) = 0;
  /// y[i] += x[i] in fp32 (e.g. the shared expert's partial into the routed experts' partial).
  virtual void accumulate_f32(const float* x, float* y, int n) = 0;
  /// x[i] *= s in fp32 (e.g. the indexer's 1/sqrt(n_I) on weights_proj's output).
  virtual void scale_f32(float* x, float s, int n) = 0;

  // ---- the pooled lightning indexer (docs/model.md) -------------------------------------------
  /// Stores row `pos[0]`: k_cache[pos] = k_normed (BF16 [D]), gate_cache[pos] = gate (fp32 [D]),
  /// valid[pos] = 1; when the row completes its pool (pos % P == P-1) the pool key
  /// K_j[c] = sum_m softmax_m(gate[jP+m,c] + ape[m,c]) * k[jP+m,c] is written to pool_keys[j].
  /// Rows jP .. pos-1 must be stored already (the CPU refuses otherwise; a GPU cannot check).
  virtual void indexer_store(const bf16* k_normed, const float* gate, const float* ape, const int32_t* pos,
                             bf16* k_cache, float* gate_cache, uint8_t* valid, float* pool_keys, int D,
                             int P) = 0;
  // indexer_norm_store: what indexer_norm_store_batch computes per row (ops::OneRow calls it on one row):
  // k_normed = layernorm(k_pre; w, b, eps) (one row of D), then exactly indexer_store(k_normed, ...):
  // bit-identical to layernorm into a buffer from allocate() followed by indexer_store on the same
  // backend, in one op (one launch on CUDA). The normed row is written to k_cache[pos] only. On
  // CUDA k_cache must be 16-byte aligned (as allocate() returns it).
  /// Scores of the complete pools visible at `pos[0]` (pools j with jP + P - 1 <= pos):
  /// I_j = sum_h w[h] * relu(q[h] . K_j / sqrt(D)), fp32. Entries past the last candidate are
  /// set to -inf. `w` already carries the 1/sqrt(n_I) factor.
  virtual void indexer_scores(const float* q, const float* w, const float* pool_keys, const int32_t* pos,
                              float* scores, int n_heads, int D, int P, int max_pools) = 0;
  /// The selection S(pos): top min(K/P, candidates) pools by score (ties: lower pool index),
  /// expanded to rows in ascending pool order, then the incomplete tail
  /// P*floor((pos+1)/P) .. pos; width K + P - 1, padded with -1.
  virtual void indexer_select(const float* scores, const int32_t* pos, int32_t* selection, int K, int P,
                              int max_pools) = 0;

  // ---- absorbed sparse MLA over the paged latent cache ----------------------------------------
  /// Writes the latent row `c_kv` [kv_lora] to slot pos[0] of the cache through `block_table`.
  virtual void kv_write(const bf16* c_kv, const int32_t* block_table, const int32_t* pos, KvCache cache) = 0;
  // kv_norm_write: what kv_norm_write_batch computes per row (ops::OneRow calls it on one row):
  // c_kv = rmsnorm(ckv_pre; w, eps) (one row of cache.kv_lora), written to slot pos[0] as kv_write
  // writes it: bit-identical to rmsnorm into a buffer from allocate() followed by kv_write on the
  // same backend, in one op (one launch on CUDA). The normed row goes to the cache only (an FP8
  // cache holds its quantised value). On CUDA cache.data must be 16-byte aligned.
  // mla_absorb_q: what mla_absorb_q_batch computes per row (ops::OneRow calls it on one row):
  // q_abs[h] = bf16(W_k,h^T q[h]) where W_k,h is rows h*(dqk+dv) .. +dqk of W_kvb [., kv_lora].
  // mla_decode: what mla_decode_batch computes per row (ops::OneRow calls it on one row):
  // o_lat[h] = bf16(sum_t softmax_t(scale * q_abs[h] . c_t) c_t) over the selected rows t
  // (entries -1 skipped), softmax in fp32. A selection with no rows gives o_lat = 0.
  // mla_out_v: what mla_out_v_batch computes per row (ops::OneRow calls it on one row):
  // o[h] = bf16(W_v,h o_lat[h]) where W_v,h is rows h*(dqk+dv)+dqk .. +dv of W_kvb.

  // ---- MoE ------------------------------------------------------------------------------------
  // moe_route: what moe_route_batch computes per row (ops::OneRow calls it on one row):
  // s = sigmoid(logits); s' = s + bias; group limit (n_group > 1: keep the topk_group groups
  // with the largest sum of their top-2 s'); idx = top-k of s' (ties: lower expert id);
  // weights = s[idx] / sum(s[idx]) * scaling. All fp32. idx is ordered by s' descending (ties:
  // lower id) and weights follow it; dropped groups' experts get s' = -inf; bias may be null (0).
  // moe_experts: what moe_experts_grouped computes per row (ops::OneRow calls it on one row):
  // out (fp32 [H]) = sum over the selected experts this rank owns of
  // weights_i * bf16(W_down,i a_i), a_i = bf16(silu(min(g, L)) * clamp(u, -L, L)),
  // g = bf16(W_gate,i x), u = bf16(W_up,i x). Overwrites `out` (zeros when none is owned).
  // limit <= 0 disables the clamp.
  // moe_experts_shared: what moe_experts_grouped computes per row (ops::OneRow calls it on one row):
  // moe_experts of the routed experts plus the shared expert `shared` (its one expert, weight 1)
  // added after them with one fp32 add: the same bits as moe_experts of each and accumulate_f32,
  // in one pass over the weights (two launches on the CUDA backend instead of five).

  // ---- batched rows (B sequences per op; KvSlots / IndexerSlots above) ------------------------
  //
  // Row b of a per-row buffer starts at b times its row size (given per op; `ld_*` arguments are
  // row strides in elements). Two kinds of op:
  // - row ops (no `slot` argument) compute every row, padded ones included, each from its own
  //   input row into its own output row, and touch nothing else;
  // - slot ops (a RowBatch argument: rb.rows rows, rb.slot, rb.pos) skip padded rows
  //   (slot[b] < 0) entirely: nothing of such a row is read (its token, position or inputs may be
  //   anything) and nothing is written (its output rows and every cache keep their bytes). A live
  //   slot must be < the pool's slots. Several rows may share a slot (ragged rows, above).
  // On the CPU backend every row is bit-identical to the single-row op it names on the same
  // inputs (same rounding points, same summation order), whatever the batch: a sequence's drafts
  // do not depend on B. On CUDA a batched kernel may sum in another order (GEMM vs GEMV).

  /// Slot op: y[b * ld_y .. + n) = embed_rmsnorm of token tokens[b] (tokens [rows]). y rows must
  /// not overlap the table.
  virtual void embed_rmsnorm_batch(const bf16* table, const int32_t* tokens, const RowBatch& rb,
                                   const bf16* w, bf16* y, int ld_y, int n, float eps) = 0;
  /// Row op: y[b * ld_y ..] = rmsnorm(x[b * ld_x .. + n)); the strided rows of rmsnorm (e.g. the
  /// second half of each [e ; h] row of the MTP front). Rows of x and y must not overlap unless
  /// they are the same rows (ld_x == ld_y, x == y).
  virtual void rmsnorm_strided(const bf16* x, int ld_x, const bf16* w, bf16* y, int ld_y, int rows, int n,
                               float eps) = 0;
  /// Row op: residual_add_rmsnorm of each row of n (x, delta, y, normed [rows, n]); x and y may
  /// alias, normed overlaps neither.
  virtual void residual_add_rmsnorm_rows(const bf16* x, const float* delta, bf16* y, const bf16* w,
                                         bf16* normed, int rows, int n, float eps) = 0;

  /// Slot op: head_argmax of each row x [rows, k] over the same shard W (BF16, or FP8 with row
  /// scales): out[b], logits [b * ld_logits .. + n) when logits is given (entries n .. ld_logits
  /// of a row are not written), extras.key[b] / extras.token[b] when given. Every weight row is
  /// read once for all rows (on the CPU too); ties to the lowest index per row.
  virtual void head_argmax_batch(const bf16* W, const fp8e4m3* W_fp8, const float* row_scale, const bf16* x,
                                 const RowBatch& rb, int n, int k, int64_t index_base, bf16* logits,
                                 int ld_logits, ArgMax* out, HeadExtras extras = {}) = 0;
  /// Row op: out[b] = argmax of x[b * ld_x .. + n) with index_base added.
  virtual void argmax_batch(const bf16* x, int ld_x, int rows, int n, int64_t index_base, ArgMax* out) = 0;
  /// Row op: token[b] = argmax_unpack_key(key[b]).
  virtual void argmax_unpack_key_batch(const uint64_t* key, int32_t* token, int rows) = 0;
  /// Row op: token[b] = argmax_pick of the n pairs of row b, candidate-major: pair i of row b is
  /// pairs[i * rows + b] (the layout of an all-gather of every rank's [rows] pairs).
  virtual void argmax_pick_batch(const ArgMax* pairs, int n, int rows, int32_t* token) = 0;

  /// Slot op: kv_norm_write of ckv_pre [rows, kv_lora] to row pos[b] of slot slot[b], through that
  /// slot's block table. Live rows of one slot must be at distinct, ascending positions (the CPU
  /// refuses otherwise); at most rb.max_seq_rows of them.
  virtual void kv_norm_write_batch(const bf16* ckv_pre, const bf16* w, float eps, const RowBatch& rb,
                                   KvSlots kv) = 0;
  /// Slot op: indexer_norm_store of k_pre [rows, D] and gate [rows, D] to row pos[b] of slot
  /// slot[b], and the pool key of every pool a row completes, from the pool's rows as stored by
  /// this op or before it: the same cache as the rows stored one at a time in batch order. Live rows
  /// of one slot at distinct, ascending positions; at most rb.max_seq_rows of them.
  virtual void indexer_norm_store_batch(const bf16* k_pre, const bf16* w, const bf16* b, float eps,
                                        const float* gate, const float* ape, const RowBatch& rb,
                                        IndexerSlots idx) = 0;
  /// Slot op: indexer_scores of q [rows, n_heads * D] and w [rows, n_heads] over slot slot[b]'s
  /// pool keys at pos[b], into scores [rows, idx.max_pools()].
  virtual void indexer_scores_batch(const float* q, const float* w, const RowBatch& rb, IndexerSlots idx,
                                    float* scores, int n_heads) = 0;
  /// Slot op: indexer_select of scores [rows, max_pools] at pos[b] into selection [rows, K + P - 1].
  virtual void indexer_select_batch(const float* scores, const RowBatch& rb, int32_t* selection, int K, int P,
                                    int max_pools) = 0;
  /// Row op (the index_share arm): the selection of a chained draft that reuses its propose's first
  /// draft's pools instead of scoring them. Row b, with a = anchor_pos[b] (the first draft's
  /// position) and p = pos[b] (this draft's, a <= p): the first min(K/P, floor((a+1)/P)) * P entries
  /// of anchor row b (the rows of the pools indexer_select chose at a, as it wrote them), then the
  /// rows P*floor((a+1)/P) .. p (the first draft's tail and every row after it), then -1 up to
  /// `width`, which must hold them (width >= K + P - 1 + p - a). anchor [rows, K + P - 1] (an
  /// indexer_select / indexer_select_batch output), selection [rows, width]. Integer copies only:
  /// every backend gives the same entries.
  virtual void indexer_share_select(const int32_t* anchor, const int32_t* anchor_pos, const int32_t* pos,
                                    int rows, int32_t* selection, int width, int K, int P) = 0;
  /// Row op: mla_absorb_q of each row: q [rows, n_heads * dqk] -> q_abs [rows, n_heads * kv_lora].
  virtual void mla_absorb_q_batch(const bf16* q, const bf16* W_kvb, bf16* q_abs, int rows, int n_heads,
                                  int dqk, int dv, int kv_lora) = 0;
  /// Slot op: mla_decode of q_abs [rows, n_heads * kv_lora] over selection [rows, width] (row
  /// ids of slot slot[b], read through its block table) into o_lat [rows, n_heads * kv_lora].
  /// Selected rows must lie inside the slot's table (< max_blocks * block_size).
  virtual void mla_decode_batch(const bf16* q_abs, const int32_t* selection, int width, const RowBatch& rb,
                                KvSlots kv, bf16* o_lat, int n_heads, float softmax_scale) = 0;
  /// Row op: mla_out_v of each row: o_lat [rows, n_heads * kv_lora] -> o [rows, n_heads * dv].
  virtual void mla_out_v_batch(const bf16* o_lat, const bf16* W_kvb, bf16* o, int rows, int n_heads, int dqk,
                               int dv, int kv_lora) = 0;

  /// Slot op: moe_route of logits [rows, num_experts] into idx / weights [rows, top_k].
  virtual void moe_route_batch(const float* logits, const float* bias, const RowBatch& rb, int num_experts,
                               int top_k, int n_group, int topk_group, float scaling, int32_t* idx,
                               float* weights) = 0;
  /// Slot op, the routed experts grouped over the batch: out [rows, H] (fp32), row b exactly
  /// moe_experts(x[b], routed, idx[b], weights[b]) (idx / weights [rows, top_k]), or with `shared`
  /// exactly moe_experts_shared of that row. Each owned expert that any live row routes to is
  /// read once and applied to all its rows (the union of the batch's experts, not rows x top_k
  /// reads); each row still sums its experts in its own idx order, so the bits match. A row
  /// routed to no local expert gets 0 (plus the shared expert). Duplicates are allowed.
  virtual void moe_experts_grouped(const bf16* x, const ExpertWeights& routed, const int32_t* idx,
                                   const float* weights, const RowBatch& rb, int top_k,
                                   const ExpertWeights* shared, float limit, float* out) = 0;

  // ---- sampling statistics (SampleParams, LogitStats above) -----------------------------------
  /// Row op: the LogitStats of each of view.rows rows under *params (backend memory): max and
  /// second of every entry, the support threshold tau of the transform (top-k, then top-p, ties
  /// kept), the sum of exp((l - max) / T) over l >= tau, and the logit of requested[b] (a global
  /// token id; null: none) when it is one of the row's tokens and l >= tau, else -inf. The
  /// transform is applied to the row as given: a shard's stats are only right without truncation
  /// (partials to combine), a truncated transform needs whole rows (one segment of the whole
  /// vocab, or the gathered segments). CUDA: two launches per 128 rows (up to 65535 rows).
  virtual void logit_stats_batch(const LogitRows& view, const int32_t* requested, const SampleParams* params,
                                 LogitStats* out) = 0;
  /// Row op: out[b] from the n partials of row b, candidate-major (part i of row b at
  /// parts[i * rows + b], the layout of an all-gather of every rank's [rows] partials):
  /// M = max of the maxes, margin = M minus the second largest of every part's (max, second),
  /// Z = sum_i sum_i * exp((max_i - M) / T), logprob = -log Z, req_logprob = (r - M) / T - log Z
  /// for r the largest requested logit (-inf when every part has -inf). fp64 on both backends.
  virtual void logit_stats_combine(const LogitStats* parts, int n, int rows, const SampleParams* params,
                                   TokenStats* out) = 0;

 protected:
  /// What kernels_chosen() returns; the backend notes its choices here.
  KernelRecord kernels_chosen_;
};

/// The CPU reference backend (always built).
std::unique_ptr<Backend> make_cpu_backend();
/// The CUDA backend on `device` (throws when mtplab was built without CUDA).
std::unique_ptr<Backend> make_cuda_backend(int device);
bool cuda_backend_available();

/// Backend memory with an owner: Array<bf16> a(be, n).
template <typename T>
class Array {
 public:
  Array() = default;
  Array(Backend& be, size_t count) : be_(&be), count_(count) {
    data_ = count ? static_cast<T*>(be.allocate(count * sizeof(T))) : nullptr;
  }
  ~Array() { reset(); }
  Array(const Array&) = delete;
  Array& operator=(const Array&) = delete;
  Array(Array&& o) noexcept : be_(o.be_), data_(o.data_), count_(o.count_) {
    o.data_ = nullptr;
    o.count_ = 0;
  }
  Array& operator=(Array&& o) noexcept {
    if (this != &o) {
      reset();
      be_ = o.be_;
      data_ = o.data_;
      count_ = o.count_;
      o.data_ = nullptr;
      o.count_ = 0;
    }
    return *this;
  }
  void reset() noexcept {
    if (data_ && be_) be_->release(data_);
    data_ = nullptr;
    count_ = 0;
  }
  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }
  Backend* backend() const { return be_; }

 private:
  Backend* be_ = nullptr;
  T* data_ = nullptr;
  size_t count_ = 0;
};

}  // namespace mtplab::ops
