// What the generated header-example sources share (header_example_extract.cpp).
#pragma once

#include <cstdlib>
#include <iostream>  // the examples print with std::cout and std::cerr, as a program would
#include <map>
#include <string>

namespace loom_docs {

// A value the example takes as given (declared in tests/docs/givens/). The example functions
// are compiled and linked, never called, so this never runs.
template <class T>
T& given() {
  std::abort();
}

// A function the example takes as given: accepts anything, returns an R.
template <class R>
auto given_fn() {
  return [](auto&&...) -> R { std::abort(); };
}

inline std::map<std::string, void (*)()>& examples() {
  static std::map<std::string, void (*)()> all;
  return all;
}

inline bool register_example(const char* header, void (*fn)()) {
  examples()[header] = fn;
  return true;
}

}  // namespace loom_docs
