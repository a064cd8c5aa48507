// train_loop: a small MLP learns y = sin(3 x) on [-1, 1] with Adam, in a loop written by hand
// (zero_grad, forward, backward, optimizer_step, mark_step).
// Prints the loss every 50 steps; exits 1 unless the last loss is under a tenth of the first.
//
//   ./train_loop [steps]        (default 300)
#include <loom/loom.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <vector>

namespace nn = loom::nn;
namespace F = loom::nn::functional;

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 300;
  if (steps < 50) {
    std::cerr << "train_loop: expected at least 50 steps, got " << (argc > 1 ? argv[1] : "") << '\n';
    return 2;
  }

  // 64 points of y = sin(3x), made on the host once.
  std::vector<float> xs, ys;
  for (int i = 0; i < 64; ++i) {
    const float x = -1.0f + 2.0f * static_cast<float>(i) / 63.0f;
    xs.push_back(x);
    ys.push_back(std::sin(3.0f * x));
  }
  const auto x = loom::from_vector<float>(xs, {64, 1});
  const auto y = loom::from_vector<float>(ys, {64, 1});

  nn::manual_seed(0);
  auto net = std::make_shared<nn::Sequential>();
  net->push_back(std::make_shared<nn::Linear>(1, 32));
  net->push_back(std::make_shared<nn::ReLU>());
  net->push_back(std::make_shared<nn::Linear>(32, 1));
  loom::optim::Adam opt(net->parameters(), {.lr = 0.01});

  double first = 0, last = 0;
  for (int step = 0; step < steps; ++step) {
    opt.zero_grad();
    auto loss = F::mse_loss(net->forward(x), y);
    loss.backward();
    loom::optim::optimizer_step(opt);  // the update (gradients averaged first under mpirun)
    loom::mark_step();                 // the step's graph: compiled at step 0, reused after
    if (step == 0 || step % 50 == 49 || step == steps - 1) {
      const double value = loss.item<float>();  // a read: waits for this step
      if (step == 0) first = value;
      last = value;
      std::cout << "step " << step + 1 << " loss " << value << '\n';
    }
  }
  std::cout << "compiles: " << loom::metrics::counter("UncachedCompile") << '\n';
  if (!(last < 0.1 * first)) {
    std::cerr << "train_loop: the loss did not fall enough: " << first << " -> " << last << '\n';
    return 1;
  }
  std::cout << "train_loop: loss fell from " << first << " to " << last << '\n';
  return 0;
}
