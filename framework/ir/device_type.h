// The names of device kinds, for device_str and parse_device. A backend registers its kind
// here through runtime::register_backend (runtime/registry.h), never directly.
#pragma once

#include <loom/dtype.h>

#include <string>
#include <string_view>
#include <vector>

namespace loom::ir {

// Returns the kind named `name`, numbering a new one in registration order. "cpu" is kind 0.
DeviceType register_device_type(std::string_view name);
// Every registered kind's name, in registration order.
std::vector<std::string> device_type_names();

}  // namespace loom::ir
