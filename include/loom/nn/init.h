// Parameter initialisation with reproducible seeds, following torch.nn.init.
//
//   loom::nn::manual_seed(42);                       // like torch.manual_seed
//   auto fc = std::make_shared<loom::nn::Linear>(784, 10);   // draws the next seeds
//   loom::nn::init::kaiming_normal_(conv->weight, /*a=*/0, loom::nn::init::FanMode::FanOut,
//                                   loom::nn::init::Nonlinearity::ReLU);   // as torchvision
//
// Every random initialiser draws one seed from a global generator (next_seed) and fills the
// tensor with loom::uniform / loom::normal, so constructing the same models in the same order after
// the same manual_seed gives the same parameters. The values are counter-based, not
// PyTorch's Mersenne-Twister stream: distributions match PyTorch, bit patterns do not.
//
// Initialisers replace the tensor's value in place (Tensor::assign under NoGradGuard), so
// handles held by modules and optimizers see the new value. The new value is pending IR:
// nothing runs until the next mark_step or read.
#pragma once

#include <loom/tensor.h>

#include <cstdint>
#include <utility>

namespace loom::nn {

// Restarts the global seed generator (the default state is manual_seed(0)).
void manual_seed(uint64_t seed);
// The next seed of the global generator (thread-safe; each call returns a new value).
uint64_t next_seed();

namespace init {

enum class FanMode { FanIn, FanOut };
enum class Nonlinearity { Linear, ReLU, LeakyReLU, Tanh, Sigmoid };

// {fan_in, fan_out} as torch.nn.init._calculate_fan_in_and_fan_out: dims 1 and 0 times the
// receptive field (the product of dims 2..). Throws loom::Error for fewer than 2 dims.
std::pair<int64_t, int64_t> fan_in_and_fan_out(const Shape& shape);
// torch.nn.init.calculate_gain; `param` is LeakyReLU's negative slope.
double calculate_gain(Nonlinearity nonlinearity, double param = 0.01);

void uniform_(const Tensor& t, double low, double high);
void normal_(const Tensor& t, double mean, double stddev);
void constant_(const Tensor& t, double value);
inline void ones_(const Tensor& t) { constant_(t, 1); }
inline void zeros_(const Tensor& t) { constant_(t, 0); }
// U(-bound, bound) with bound = gain * sqrt(3 / fan), gain = calculate_gain(nonlinearity, a).
void kaiming_uniform_(const Tensor& t, double a = 0, FanMode mode = FanMode::FanIn,
                      Nonlinearity nonlinearity = Nonlinearity::LeakyReLU);
// N(0, std^2) with std = gain / sqrt(fan).
void kaiming_normal_(const Tensor& t, double a = 0, FanMode mode = FanMode::FanIn,
                     Nonlinearity nonlinearity = Nonlinearity::LeakyReLU);

}  // namespace init
}  // namespace loom::nn
