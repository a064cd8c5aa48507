// header_examples: every public header's opening usage example, compiled and linked (the
// sources are generated from the headers at build time; see header_example_extract.cpp).
// Building this program is most of the test; running it checks that every header under
// include/loom/ contributed its example, so a header cannot drop out unnoticed.
#include "header_example_support.h"

#include <iostream>
#include <sstream>
#include <string>

int main() {
  std::istringstream expected(LOOM_PUBLIC_HEADERS);  // space-separated, relative to include/loom/
  int missing = 0, count = 0;
  for (std::string h; expected >> h; ++count) {
    auto it = loom_docs::examples().find(h);
    if (it == loom_docs::examples().end() || it->second == nullptr) {
      std::cerr << "header_examples: no compiled example for include/loom/" << h << '\n';
      ++missing;
    }
  }
  if (static_cast<size_t>(count) != loom_docs::examples().size()) {
    std::cerr << "header_examples: " << loom_docs::examples().size() << " examples registered for "
              << count << " headers\n";
    return 1;
  }
  if (missing > 0) return 1;
  std::cout << "header_examples: " << count << " header examples compiled and linked\n";
  return 0;
}
