#include <loom/nn/layers.h>

#include <loom/error.h>

#include <string>

namespace loom::nn {

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) {
  for (const auto& m : modules) push_back(m);
}

Sequential::Sequential(const std::vector<std::shared_ptr<Module>>& modules) {
  for (const auto& m : modules) push_back(m);
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& m : modules_) x = m->forward(x);
  return x;
}

const std::shared_ptr<Module>& Sequential::operator[](std::size_t i) const {
  if (i >= modules_.size())
    throw Error("Sequential: index " + std::to_string(i) + " is out of range for " +
                std::to_string(modules_.size()) + " modules");
  return modules_[i];
}

}  // namespace loom::nn
