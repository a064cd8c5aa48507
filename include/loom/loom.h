// loom: the whole public API in one include (every header under loom/ but loom/testing.h,
// which holds test hooks into the engine).
//
//   #include <loom/loom.h>
//
//   int main() {
//     loom::nn::manual_seed(0);
//     auto net = std::make_shared<loom::nn::Linear>(4, 1);
//     loom::optim::SGD opt(net->parameters(), {.lr = 0.1});
//     auto x = loom::rand({8, 4}, /*seed=*/1);
//     auto y = loom::sum(x, {1}, /*keepdim=*/true);
//     for (int step = 0; step < 10; ++step) {
//       opt.zero_grad();
//       auto loss = loom::nn::functional::mse_loss(net->forward(x), y);
//       loss.backward();
//       loom::optim::optimizer_step(opt, /*barrier=*/true);   // update, then mark_step()
//     }
//     return 0;
//   }
//
// In CMake: find_package(loom REQUIRED) and link loom::loom (README, "Using loom from your own
// project"; examples/ is such a project).
#pragma once

#include <loom/autocast.h>
#include <loom/autograd.h>
#include <loom/bfloat16.h>
#include <loom/checkpoint.h>
#include <loom/compile.h>
#include <loom/data/dataset.h>
#include <loom/data/hdf5.h>
#include <loom/data/loader.h>
#include <loom/data/sampler.h>
#include <loom/data/transforms.h>
#include <loom/debug.h>
#include <loom/dist.h>
#include <loom/dtype.h>
#include <loom/error.h>
#include <loom/lazy.h>
#include <loom/metrics.h>
#include <loom/models/decoder.h>
#include <loom/models/resnet.h>
#include <loom/nn/functional.h>
#include <loom/nn/init.h>
#include <loom/nn/layers.h>
#include <loom/nn/module.h>
#include <loom/openmp.h>
#include <loom/optim.h>
#include <loom/profiler.h>
#include <loom/tensor.h>
#include <loom/trainer.h>
