// Collectives on host memory: the MPI calls under every loom::dist collective, cut into
// messages of at most kBucketBytes (MPI counts are int, and huge messages hold whole
// buffers hostage in the transport).
#include "mpi_util.h"

#include <algorithm>
#include <string>
#include <vector>

namespace loom::dist {
namespace {

MPI_Datatype mpi_type(DType t, const char* who) {
  switch (t) {
    case DType::Float32: return MPI_FLOAT;
    case DType::Float64: return MPI_DOUBLE;
    case DType::Int64: return MPI_INT64_T;
    case DType::Int32: return MPI_INT32_T;
    case DType::Bool: break;
    case DType::BFloat16:
      throw Error(std::string(who) + ": cannot reduce bfloat16 tensors; cast to float32 first");
  }
  throw Error(std::string(who) + ": cannot reduce " + dtype_name(t) + " tensors; cast to int32 first");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Mean: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

template <class T>
void divide(void* data, int64_t count, int by) {
  auto* p = static_cast<T*>(data);
  for (int64_t i = 0; i < count; ++i) p[i] /= static_cast<T>(by);
}

}  // namespace

namespace detail {

void all_reduce_host(void* data, int64_t count, DType dtype, ReduceOp op, const char* who) {
  MPI_Datatype type = mpi_type(dtype, who);
  if (op == ReduceOp::Mean && !is_floating(dtype))
    throw Error(std::string(who) + ": Mean needs a floating-point tensor, got " + dtype_name(dtype));
  if (!is_distributed() || count == 0) return;
  const auto elem = static_cast<int64_t>(dtype_size(dtype));
  const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>(kBucketBytes) / elem);
  auto* bytes = static_cast<unsigned char*>(data);
  for (int64_t at = 0; at < count; at += chunk) {
    int n = static_cast<int>(std::min(chunk, count - at));
    check(MPI_Allreduce(MPI_IN_PLACE, bytes + at * elem, n, type, mpi_op(op), MPI_COMM_WORLD), who, "MPI_Allreduce");
  }
  if (op != ReduceOp::Mean) return;
  if (dtype == DType::Float32) divide<float>(data, count, world_size());
  else divide<double>(data, count, world_size());
}

void broadcast_host(void* data, std::size_t bytes, int root, const char* who) {
  if (!is_distributed() || bytes == 0) return;
  auto* p = static_cast<unsigned char*>(data);
  for (std::size_t at = 0; at < bytes; at += kBucketBytes) {
    int n = static_cast<int>(std::min(kBucketBytes, bytes - at));
    check(MPI_Bcast(p + at, n, MPI_BYTE, root, MPI_COMM_WORLD), who, "MPI_Bcast");
  }
}

Digest& Digest::add(uint64_t word) {
  // splitmix64's finaliser over (state + word): order-sensitive and well mixed.
  uint64_t z = h_ + 0x9e3779b97f4a7c15ULL + word;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  h_ = z ^ (z >> 31);
  return *this;
}

void check_same_on_all_ranks(uint64_t digest, const char* who, const std::string& what) {
  if (!is_distributed()) return;
  // max(d) and max(~d) = ~min(d) in one message: the ranks agree when min == max.
  uint64_t v[2] = {digest, ~digest};
  check(MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD), who, "MPI_Allreduce");
  if (v[0] != ~v[1])
    throw Error(std::string(who) + ": the ranks disagree on " + what + "; every rank must make the same collective calls");
}

}  // namespace detail

double all_reduce(double value, ReduceOp op) {
  // A digest first, as every collective here sends, so that a rank in another collective
  // meets this one's digest with its own and both fail, rather than an MPI type mismatch.
  if (is_distributed())
    detail::check_same_on_all_ranks(detail::Digest().add(1).add(static_cast<uint64_t>(op)).value(),
                                    "dist::all_reduce", "the kind of value (one number) or the reduce op");
  detail::all_reduce_host(&value, 1, DType::Float64, op, "dist::all_reduce");
  return value;
}

std::vector<double> all_reduce(std::vector<double> values, ReduceOp op) {
  if (is_distributed())
    detail::check_same_on_all_ranks(detail::Digest().add(values.size()).add(static_cast<uint64_t>(op)).value(),
                                    "dist::all_reduce", "the number of values or the reduce op");
  detail::all_reduce_host(values.data(), static_cast<int64_t>(values.size()), DType::Float64, op, "dist::all_reduce");
  return values;
}

}  // namespace loom::dist
