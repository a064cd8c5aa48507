#include "ir/setting.h"

#include <loom/error.h>

#include <algorithm>
#include <cstdlib>

namespace loom::ir {

std::string env_setting(const char* name, std::string_view fallback,
                        std::initializer_list<std::string_view> allowed) {
  const char* v = std::getenv(name);
  if (!v) return std::string(fallback);
  if (std::find(allowed.begin(), allowed.end(), std::string_view(v)) != allowed.end()) return v;
  std::string expected;
  std::size_t k = 0;
  for (const auto a : allowed) {
    if (k > 0) expected += k + 1 == allowed.size() ? " or " : ", ";
    expected += a;
    ++k;
  }
  throw Error(std::string(name) + ": expected " + expected + ", got '" + v + "'");
}

}  // namespace loom::ir
