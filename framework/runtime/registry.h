// The device registry: one factory per kind of device, one backend per device, made on first
// use and kept for the life of the process (its thread must outlive static tensors).
//
//   DeviceType kind = runtime::register_backend("guarded", 2, [](int index) {
//     return std::make_unique<GuardedBackend>(index);
//   });
//   runtime::Backend& be = runtime::backend(Device{kind, 1});
//
// The built-in backends are registered in builtin_backends.cpp, one line each; any other
// (the test suite's) registers itself before its first tensor.
#pragma once

#include "runtime/backend.h"

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace loom::runtime {

using BackendFactory = std::function<std::unique_ptr<Backend>(int index)>;

// Registers a kind of device named `name` with `count` devices (indices 0..count-1) and
// returns its DeviceType. With no devices, `why_none` says why (no driver, no GPU), and asking
// for one names the reason. Throws loom::Error when `name` is registered already.
DeviceType register_backend(std::string_view name, int count, BackendFactory factory,
                            std::string why_none = {});

// The backend of `device`, made on first use; throws loom::Error naming the registered
// devices when `device` is not one of them.
Backend& backend(Device device);

// Registers the exit hook (which lets every device finish its queued work before the
// process's statics are torn down) once more, so that it also runs before the teardown of
// whatever a library made for itself until now: oneDNN makes some of its statics the first
// time a kernel runs (the AMX tile configuration's code), on a device thread, after the hook
// was first registered. A backend calls it after a program's first run; it is cheap and may
// be called from any thread.
void renew_exit_hook();

// The devices whose backend has been made, in the order they were first used.
std::vector<Device> devices_in_use();

// Registers the backends built into the library (builtin_backends.cpp).
void register_builtin_backends();

}  // namespace loom::runtime
