// dist_collectives: checks loom::dist's collectives under mpirun (any number of processes) and
// prints "dist_collectives: all checks passed on N processes"; a failed check is a
// loom::Error, which ends the job through run_main. --mismatch [shape|op|kind] makes the ranks
// call a collective with different shapes, a tensor all_reduce with different reduce ops, or
// different collectives (a number's all_reduce against a tensor's), which must be an error on
// every rank, not a hang or mixed data.
#include "recipe_util.h"

#include <loom/dist.h>
#include <loom/lazy.h>

#include <cmath>
#include <iostream>
#include <string>
#include <vector>

namespace {

using namespace loom;

void expect(bool ok, const std::string& what) {
  if (!ok) throw Error("check failed: " + what);
}

std::vector<double> values(const Tensor& t) { return t.to(DType::Float64).to_vector<double>(); }

int run(int argc, char** argv) {
  dist::init();
  const int r = dist::rank(), w = dist::world_size();
  const double sum_r = w * (w - 1) / 2.0;  // 0 + 1 + ... + (w-1)
  if (argc > 1 && std::string(argv[1]) == "--mismatch") {
    const std::string how = argc > 2 ? argv[2] : "shape";
    if (how == "op") dist::all_reduce(ones({4}), r == 0 ? dist::ReduceOp::Sum : dist::ReduceOp::Mean);
    else if (how == "kind" && r == 0) dist::all_reduce(1.0);
    else if (how == "kind") dist::all_reduce(ones({4}));
    else dist::all_reduce(zeros({r + 1}));
    return 0;
  }
  expect(dist::local_rank() == r && dist::local_size() == w, "one host: local rank and size equal the global ones");

  // Tensors: every op, float and integer, pending operands.
  auto x = from_vector<float>({1, 2}, {2}) * static_cast<double>(r + 1);  // pending
  expect(values(dist::all_reduce(x)) == std::vector<double>{sum_r + w, 2 * (sum_r + w)}, "all_reduce Sum");
  auto mean = values(dist::all_reduce(x, dist::ReduceOp::Mean));
  expect(std::abs(mean[0] - (sum_r + w) / w) < 1e-6, "all_reduce Mean");
  expect(values(dist::all_reduce(x, dist::ReduceOp::Max))[1] == 2.0 * w, "all_reduce Max");
  expect(values(dist::all_reduce(x, dist::ReduceOp::Min))[1] == 2.0, "all_reduce Min");
  auto i = from_vector<int64_t>({r, 10}, {2});
  expect(values(dist::all_reduce(i)) == std::vector<double>{sum_r, 10.0 * w}, "all_reduce of int64");
  auto b = dist::broadcast(full({3}, r + 5.0), w - 1);
  expect(values(b) == std::vector<double>(3, w + 4.0), "broadcast from the last rank");
  expect(dist::all_reduce(static_cast<double>(r), dist::ReduceOp::Max) == w - 1, "host all_reduce");
  dist::barrier();

  // Gradients: two that share a 4 MiB bucket, one too big for it (cut into two messages),
  // one float64 (a bucket of its own dtype) and one parameter without a gradient.
  std::vector<Tensor> params{zeros({600000}), zeros({600, 1000}), zeros({1500000}), zeros({3}, DType::Float64),
                             zeros({2})};
  for (std::size_t k = 0; k + 1 < params.size(); ++k) {
    const auto& p = params[k];
    params[k].set_grad(full(p.shape(), static_cast<double>(r + k), p.dtype()));
  }
  dist::all_reduce_gradients(params);
  for (std::size_t k = 0; k + 1 < params.size(); ++k) {
    auto g = values(params[k].grad());
    const double want = sum_r / w + static_cast<double>(k);
    expect(g.size() == static_cast<std::size_t>(params[k].numel()) && std::abs(g.front() - want) < 1e-6 &&
               std::abs(g.back() - want) < 1e-6,
           "the mean gradient of parameter " + std::to_string(k));
  }
  expect(!params.back().grad().defined(), "a parameter without a gradient keeps none");

  // Parameters: every rank ends with root's values, in place.
  auto p = from_vector<float>({static_cast<float>(r), 7}, {2});
  dist::broadcast_parameters({p}, 0);
  expect(values(p) == std::vector<double>{0, 7}, "broadcast_parameters");

  if (r == 0) std::cout << "dist_collectives: all checks passed on " << w << " processes\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return loom::recipes::run_main("dist_collectives", run, argc, argv); }
