// Settings read from the environment (the LOOM_* variables the README lists): one place that
// checks a value against the ones a setting takes and names all of them when it does not.
//
//   static const bool on = env_setting("LOOM_STACK_REDUCTIONS", "1", {"0", "1"}) == "1";
//
// Callers keep the result in a static, so each variable is read once per process.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

namespace loom::ir {

// The value of environment variable `name`: `fallback` when it is unset, otherwise one of
// `allowed`; any other value throws loom::Error "NAME: expected a, b or c, got 'value'".
std::string env_setting(const char* name, std::string_view fallback,
                        std::initializer_list<std::string_view> allowed);

}  // namespace loom::ir
