// Collectives on device tensors. MPI cannot reach a pending (lazy) value, so each collective
// materialises its operand, reduces or broadcasts a host copy and hands back new device data.
// New device data is a leaf that hashes by shape, never by contents, so a training step that
// goes through a collective still compiles nothing after its first run.
#include "mpi_util.h"

#include <loom/autograd.h>
#include <loom/lazy.h>

#include <string>
#include <vector>

namespace loom::dist {
namespace {

void add_layout(detail::Digest& d, const Tensor& t) {
  d.add(static_cast<uint64_t>(t.dtype())).add(t.shape().size());
  for (auto s : t.shape()) d.add(static_cast<uint64_t>(s));
}

void check_root(int root, const char* who) {
  if (root < 0 || root >= world_size())
    throw Error(std::string(who) + ": expected a root rank in [0, " + std::to_string(world_size()) + "), got " +
                std::to_string(root));
}

HostTensor empty_like(const Tensor& t) {
  HostTensor h;
  h.dtype = t.dtype();
  h.shape = t.shape();
  h.bytes.resize(static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype()));
  return h;
}

Tensor to_device(const HostTensor& h, Device device) { return from_host(h.bytes.data(), h.dtype, h.shape, device); }

}  // namespace

Tensor all_reduce(const Tensor& t, ReduceOp op) {
  const char* who = "dist::all_reduce";
  if (!t.defined()) throw Error(std::string(who) + ": got an undefined tensor");
  if (t.dtype() == DType::Bool) throw Error(std::string(who) + ": cannot reduce bool tensors; cast to int32 first");
  if (op == ReduceOp::Mean && !is_floating(t.dtype()))
    throw Error(std::string(who) + ": Mean needs a floating-point tensor, got " + dtype_name(t.dtype()));
  if (!is_distributed()) return t;
  detail::Digest d;
  add_layout(d, t);
  d.add(static_cast<uint64_t>(op));  // MPI needs one op on every rank; Sum and Mean differ here
  detail::check_same_on_all_ranks(d.value(), who, "the tensor's shape or dtype, or the reduce op");
  if (t.numel() == 0) return t;
  auto h = t.to_host();
  detail::all_reduce_host(h.bytes.data(), h.numel(), h.dtype, op, who);
  return to_device(h, t.device());
}

Tensor broadcast(const Tensor& t, int root) {
  const char* who = "dist::broadcast";
  if (!t.defined()) throw Error(std::string(who) + ": got an undefined tensor");
  check_root(root, who);
  if (!is_distributed()) return t;
  detail::Digest d;
  add_layout(d, t);
  d.add(static_cast<uint64_t>(root));
  detail::check_same_on_all_ranks(d.value(), who, "the tensor's shape or dtype, or the root");
  if (t.numel() == 0) return t;
  auto h = rank() == root ? t.to_host() : empty_like(t);
  detail::broadcast_host(h.bytes.data(), h.bytes.size(), root, who);
  return to_device(h, t.device());
}

void broadcast_parameters(const std::vector<Tensor>& tensors, int root) {
  const char* who = "dist::broadcast_parameters";
  for (const auto& t : tensors)
    if (!t.defined()) throw Error(std::string(who) + ": got an undefined tensor");
  check_root(root, who);
  if (!is_distributed()) return;
  detail::Digest d;
  d.add(tensors.size());
  for (const auto& t : tensors) add_layout(d, t);
  d.add(static_cast<uint64_t>(root));
  detail::check_same_on_all_ranks(d.value(), who, "the number, shapes or dtypes of the tensors, or the root");
  const bool me = rank() == root;
  // Fresh parameters are pending initialisers: compute them in one graph, not one per read.
  // The other ranks' initial values are replaced unseen, so they need not be computed at all.
  if (me) mark_step();
  NoGradGuard no_grad;
  for (const auto& t : tensors) {
    if (t.numel() == 0) continue;
    auto h = me ? t.to_host() : empty_like(t);
    detail::broadcast_host(h.bytes.data(), h.bytes.size(), root, who);
    if (!me) t.assign(to_device(h, t.device()));
  }
}

void all_reduce_gradients(const std::vector<Tensor>& params) {
  const char* who = "optimizer_step";
  if (!is_distributed()) return;
  NoGradGuard no_grad;
  // Consecutive gradients of one dtype share a bucket up to kBucketBytes; a larger gradient
  // gets a bucket of its own (all_reduce_host still cuts it into kBucketBytes messages).
  struct Bucket {
    DType dtype;
    std::size_t bytes = 0;
    std::vector<std::size_t> members;  // indices into params
    Tensor flat;
  };
  std::vector<Bucket> buckets;
  detail::Digest d;
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto g = params[i].grad();
    if (!g.defined() || g.numel() == 0) continue;
    d.add(i);
    add_layout(d, g);
    auto bytes = static_cast<std::size_t>(g.numel()) * dtype_size(g.dtype());
    if (buckets.empty() || buckets.back().dtype != g.dtype() || buckets.back().bytes + bytes > kBucketBytes)
      buckets.push_back({g.dtype()});
    buckets.back().bytes += bytes;
    buckets.back().members.push_back(i);
  }
  detail::check_same_on_all_ranks(d.value(), who,
                                  "which parameters have gradients, or their shapes (every rank must compute "
                                  "gradients for the same parameters)");
  if (buckets.empty()) return;
  for (auto& b : buckets) {
    std::vector<Tensor> parts;
    for (auto i : b.members) parts.push_back(reshape(params[i].grad(), {-1}));
    b.flat = parts.size() == 1 ? parts[0] : concat(parts, 0);
  }
  // One graph computes the step so far (forward, backward) and the flat buckets; the reads
  // below then only copy.
  mark_step();
  for (auto& b : buckets) {
    auto h = b.flat.to_host();
    detail::all_reduce_host(h.bytes.data(), h.numel(), h.dtype, ReduceOp::Mean, who);
    auto mean = to_device(h, b.flat.device());
    int64_t at = 0;
    for (auto i : b.members) {
      Tensor p = params[i];  // a handle: the gradient lives in the shared state
      auto shape = p.grad().shape();
      int64_t n = shape_numel(shape);
      p.set_grad(reshape(b.members.size() == 1 ? mean : slice(mean, 0, at, at + n), shape));
      at += n;
    }
  }
}

}  // namespace loom::dist
