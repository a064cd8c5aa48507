#include "runtime/registry.h"

#include "ir/device_type.h"

#include <loom/error.h>

#include <charconv>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace loom::runtime {
namespace {

struct Kind {
  int count = 0;
  BackendFactory factory;
  std::vector<Backend*> made;  // per index; leaked
  std::string why_none;        // count == 0: why
};

struct Registry {
  // Recursive: a backend's factory may ask for another device's backend (the test suite's
  // runs its programs on the CPU's).
  std::recursive_mutex mutex;
  std::vector<Kind> kinds;  // by DeviceType
  std::vector<Device> in_use;
};

Registry& registry() {
  static auto* r = new Registry;  // leaked, with the backends it made
  return *r;
}

std::string registered(const Registry& r) {
  std::string out;
  for (std::size_t k = 0; k < r.kinds.size(); ++k)
    if (r.kinds[k].count > 0)
      out += (out.empty() ? "" : ", ") + device_type_name(static_cast<DeviceType>(k)) +
             (r.kinds[k].count == 1 ? ":0" : ":0-" + std::to_string(r.kinds[k].count - 1));
  return out;
}

DeviceType add_kind(Registry& r, std::string_view name, int count, BackendFactory factory,
                    std::string why_none) {
  if (count < 0) throw Error("register_backend: expected a device count >= 0, got " + std::to_string(count));
  auto type = ir::register_device_type(name);
  auto k = static_cast<std::size_t>(type);
  if (r.kinds.size() <= k) r.kinds.resize(k + 1);
  if (r.kinds[k].factory)
    throw Error("register_backend: a backend for '" + std::string(name) + "' is registered already");
  r.kinds[k] = Kind{count, std::move(factory), std::vector<Backend*>(static_cast<std::size_t>(count)),
                    std::move(why_none)};
  return type;
}

std::once_flag builtins_once;
std::once_flag exit_hook_once;

// The backends are leaked, and with them their device threads, so a step still running when
// main returns would run on while the runtime libraries (TBB's scheduler, oneDNN, libgomp)
// are torn down beneath it; it then aborts with "pure virtual method called", or faults in
// code oneDNN has freed. Registered when the first backend is made, which is after those
// libraries were loaded, so this runs before their teardown: it lets every device finish its
// queued work first. Exit handlers and statics are torn down in the reverse order of their
// registration, and a library's lazily made statics (oneDNN's AMX tile configuration, made by
// the first kernel that uses it) come later: renew_exit_hook registers it again after them.
// The registry's lock is not held while waiting: a step still running may itself ask for a
// backend.
void finish_device_work_at_exit() {
  auto& r = registry();
  std::vector<Backend*> made;
  {
    std::lock_guard lock(r.mutex);
    for (const auto& kind : r.kinds)
      for (auto* be : kind.made)
        if (be) made.push_back(be);
  }
  for (auto* be : made) {
    try {
      be->synchronize();
    } catch (...) {
      // Errors of a step nobody waited for are not reported at exit.
    }
  }
}

// Set on the thread that registers the built-in backends, whose registrations must not wait
// for that registration to finish.
thread_local bool registering_builtins = false;

void ensure_builtins() {
  if (registering_builtins) return;  // a built-in backend's registration asking
  std::call_once(builtins_once, [] {
    registering_builtins = true;
    register_builtin_backends();
    registering_builtins = false;
  });
}

}  // namespace

void renew_exit_hook() { std::atexit(finish_device_work_at_exit); }

DeviceType register_backend(std::string_view name, int count, BackendFactory factory,
                            std::string why_none) {
  // The built-in kinds come first, so the CPU is kind 0 whoever registers first.
  ensure_builtins();
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  return add_kind(r, name, count, std::move(factory), std::move(why_none));
}

Backend& backend(Device device) {
  ensure_builtins();
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  auto k = static_cast<std::size_t>(device.type);
  if (k >= r.kinds.size() || device.index < 0 || device.index >= r.kinds[k].count) {
    const bool none = k < r.kinds.size() && r.kinds[k].count == 0 && !r.kinds[k].why_none.empty();
    throw Error("device: no device " + device_str(device) +
                (none ? ": " + r.kinds[k].why_none : "") + " (registered: " + registered(r) + ")");
  }
  auto& kind = r.kinds[k];
  auto*& be = kind.made[static_cast<std::size_t>(device.index)];
  if (!be) {
    be = kind.factory(device.index).release();
    r.in_use.push_back(device);
    std::call_once(exit_hook_once, [] { std::atexit(finish_device_work_at_exit); });
  }
  return *be;
}

std::vector<Device> devices_in_use() {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  return r.in_use;
}

}  // namespace loom::runtime

namespace loom {

Device parse_device(std::string_view text) {
  runtime::ensure_builtins();  // so that "cuda" is a kind before its first use
  auto colon = text.find(':');
  auto kind = text.substr(0, colon);
  Device d;
  if (colon != std::string_view::npos) {
    auto digits = text.substr(colon + 1);
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), d.index);
    if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() || d.index < 0)
      throw Error("device: expected 'kind' or 'kind:index' with a non-negative index, got '" +
                  std::string(text) + "'");
  }
  auto names = ir::device_type_names();
  for (std::size_t i = 0; i < names.size(); ++i)
    if (names[i] == kind) {
      d.type = static_cast<DeviceType>(i);
      return d;
    }
  std::string known;
  for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
  throw Error("device: unknown kind '" + std::string(kind) + "' in '" + std::string(text) +
              "' (registered: " + known + ")");
}

int device_count(DeviceType type) {
  runtime::ensure_builtins();
  auto& r = runtime::registry();
  std::lock_guard lock(r.mutex);
  const auto k = static_cast<std::size_t>(type);
  return k < r.kinds.size() ? r.kinds[k].count : 0;
}

}  // namespace loom
