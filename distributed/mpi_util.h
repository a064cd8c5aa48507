// Private to distributed/: the MPI side of loom::dist. MPI status codes become loom::Error at this
// boundary; host buffers go through MPI in messages of at most kBucketBytes.
#pragma once

#include <loom/dist.h>

#include <mpi.h>

#include <cstdint>
#include <string>

namespace loom::dist::detail {

// True once MPI is initialised (a launcher started this process).
bool mpi_started();

// Throws loom::Error "<who>: <call> failed: <MPI's message>" unless status is MPI_SUCCESS.
void check(int status, const char* who, const char* call);

// Reduces `count` elements of `dtype` at `data` in place over the ranks.
void all_reduce_host(void* data, int64_t count, DType dtype, ReduceOp op, const char* who);
// Copies root's `bytes` bytes at `data` to every rank.
void broadcast_host(void* data, std::size_t bytes, int root, const char* who);

// A 64-bit digest of what a rank is about to send (shapes, dtypes, counts).
class Digest {
 public:
  Digest& add(uint64_t word);
  uint64_t value() const { return h_; }

 private:
  uint64_t h_ = 0x6c6f6f6d64697374ULL;
};

// Collective: throws loom::Error on every rank when the ranks passed different digests, so a
// mismatched collective is an error, not a hang or silently mixed data. `what` names what
// must agree.
void check_same_on_all_ranks(uint64_t digest, const char* who, const std::string& what);

}  // namespace loom::dist::detail
