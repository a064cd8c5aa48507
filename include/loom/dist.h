// Data-parallel training over MPI: mpirun starts the same program on every rank; each rank
// trains on its shard of the data and optimizer_step averages the gradients before updating.
//
//   int main() {
//     loom::dist::init();                                  // rank 0 of 1 without mpirun
//     loom::data::DeviceLoader loader(train, {.batch_size = 64, .shuffle = true,
//                                             .rank = loom::dist::rank(),
//                                             .world_size = loom::dist::world_size()});
//     auto net = make_model();
//     loom::optim::SGD opt(net->parameters(), {.lr = 0.1}); // every rank gets rank 0's values
//     for (auto& batch : loader) {
//       opt.zero_grad();
//       loss_fn(net, batch).backward();
//       loom::optim::optimizer_step(opt);                  // averages gradients, then updates
//     }
//   }
//   // mpirun -np 2 ./train          several hosts: mpirun -np 8 --hostfile hosts ./train
//
// Collectives on tensors materialise their operand (pending values are computed first), run
// MPI on a host copy and give back a new device tensor. Every rank must call the same
// collectives in the same order with tensors of the same shape and dtype; that is checked, so
// a mismatch is a loom::Error on every rank rather than a hang. Call them from one thread.
//
// Failure: once MPI is up, an uncaught exception anywhere ends the whole job (MPI_Abort) with
// the rank and the message, and a rank that dies makes mpirun end the others. Programs that
// catch errors themselves (the recipes' run_main) call dist::abort().
#pragma once

#include <loom/tensor.h>

#include <cstddef>
#include <string>
#include <vector>

namespace loom::dist {

enum class ReduceOp { Sum, Mean, Max, Min };

// Starts MPI when an MPI launcher started this process (mpirun / mpiexec / srun set
// OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK); otherwise this process is rank 0 of 1 and
// nothing here touches MPI. Idempotent, and every function below but abort() calls it, so an explicit
// call only chooses the moment (first thing in main, before threads start). MPI_Finalize runs
// at exit.
void init();
int rank();
int world_size();
// The rank among the processes on this host, and their count (to pick a device).
int local_rank();
int local_size();
// world_size() > 1.
bool is_distributed();

// ---- collectives on tensors (world size 1: they return their operand) ----
// Elementwise over the ranks; Mean needs a floating-point tensor. Bool tensors are refused.
Tensor all_reduce(const Tensor& t, ReduceOp op = ReduceOp::Sum);
// root's value of `t`; the other ranks' `t` gives only the shape and dtype (it is not computed).
Tensor broadcast(const Tensor& t, int root = 0);
void barrier();

// In place (Tensor::assign, so every handle sees it): each tensor takes root's value. For
// parameters and buffers, so that every rank holds the same model.
void broadcast_parameters(const std::vector<Tensor>& tensors, int root = 0);

// Replaces each parameter's gradient by its mean over the ranks (a no-op for world size 1).
// Gradients are packed into buckets of at most kBucketBytes per MPI message, so a big model
// makes many moderate messages rather than one huge one. Parameters without a gradient are
// skipped; which ones have one must agree over the ranks (checked). optimizer_step calls it.
inline constexpr std::size_t kBucketBytes = std::size_t{4} << 20;
void all_reduce_gradients(const std::vector<Tensor>& params);

// ---- host values (counts, flags, timings) ----
double all_reduce(double value, ReduceOp op = ReduceOp::Sum);
std::vector<double> all_reduce(std::vector<double> values, ReduceOp op = ReduceOp::Sum);

// Prints "[rank R of W] message" on stderr and ends every rank of the job with `code`
// (MPI_Abort); without MPI it prints the message and exits with `code`.
[[noreturn]] void abort(const std::string& message, int code = 1);

}  // namespace loom::dist
