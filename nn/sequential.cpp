#include <loom/nn/layers.h>

#include <loom/error.h>

#include <string>
#include <vector>

namespace loom::nn {

Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) {
  for (const auto& m : modules) push_back(m);
}

Sequential::Sequential(const std::vector<std::shared_ptr<Module>>& modules) {
  for (const auto& m : modules) push_back(m);
}

Tensor Sequential::forward(const Tensor& input) {
  // Which modules run is host control flow: one appended traces a captured step again (a
  // replay would run the captured list). push_back is the only change a Sequential takes.
  guard_settings("Sequential's modules", [this] { return std::vector<double>{static_cast<double>(modules_.size())}; });
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
