#include <loom/nn/layers.h>

#include <loom/error.h>

#include <cstdint>
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
  // Which modules run, in which order, is host control flow: a module added, removed or
  // replaced traces a captured step again (a replay would run the captured list).
  guard_settings("Sequential's modules", [this] {
    std::vector<double> ids;  // addresses: 48 bits, exact as doubles
    for (const auto& m : modules_) ids.push_back(static_cast<double>(reinterpret_cast<std::uintptr_t>(m.get())));
    return ids;
  });
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
