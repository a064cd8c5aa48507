#include <loom/metrics.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>

namespace loom::metrics {
namespace {

// A counter's share on one device; looked up by a string_view without building a string.
struct DeviceKey {
  std::string name;
  int device;  // DeviceType * 65536 + index
};
struct DeviceKeyView {
  std::string_view name;
  int device;
};
struct DeviceKeyLess {
  using is_transparent = void;
  template <class A, class B>
  bool operator()(const A& a, const B& b) const {
    return a.device != b.device ? a.device < b.device : std::string_view(a.name) < std::string_view(b.name);
  }
};

int device_code(Device d) { return static_cast<int>(d.type) * 65536 + d.index; }
Device device_of(int code) { return Device{static_cast<DeviceType>(code / 65536), code % 65536}; }

struct Registry {
  std::mutex mutex;
  // std::less<> looks names up as string_views: no std::string is built for a lookup.
  std::map<std::string, int64_t, std::less<>> counters;
  std::map<DeviceKey, int64_t, DeviceKeyLess> device_counters;
  std::map<std::string, Stat, std::less<>> stats;
};

Registry& registry() {
  static auto* r = new Registry;  // leaked: metrics are recorded until the very end
  return *r;
}

bool is_time(const std::string& name) { return name.size() > 4 && name.ends_with("Time"); }

std::string format_value(const std::string& name, double v) {
  char buf[64];
  if (!is_time(name)) std::snprintf(buf, sizeof buf, "%.6g", v);
  else if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.3fs", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.3fms", v / 1e6);
  else std::snprintf(buf, sizeof buf, "%.3fus", v / 1e3);
  return buf;
}

// Adds to the total of `name`; the caller holds r.mutex.
void add_total(Registry& r, std::string_view name, int64_t by) {
  auto it = r.counters.find(name);
  if (it == r.counters.end()) r.counters.emplace(std::string(name), by);
  else it->second += by;
}

}  // namespace

void increment(std::string_view name, int64_t by) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  add_total(r, name, by);
}

int64_t counter(std::string_view name) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.counters.find(name);
  return it == r.counters.end() ? 0 : it->second;
}

void increment(std::string_view name, Device device, int64_t by) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  add_total(r, name, by);
  DeviceKeyView key{name, device_code(device)};
  auto d = r.device_counters.find(key);
  if (d == r.device_counters.end()) r.device_counters.emplace(DeviceKey{std::string(name), key.device}, by);
  else d->second += by;
}

int64_t counter(std::string_view name, Device device) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.device_counters.find(DeviceKeyView{name, device_code(device)});
  return it == r.device_counters.end() ? 0 : it->second;
}

void record(std::string_view name, double value) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.stats.find(name);
  if (it == r.stats.end()) it = r.stats.emplace(std::string(name), Stat{}).first;
  auto& s = it->second;
  s.min = s.count ? std::min(s.min, value) : value;
  s.max = s.count ? std::max(s.max, value) : value;
  s.total += value;
  ++s.count;
}

Stat stat(std::string_view name) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.stats.find(name);
  return it == r.stats.end() ? Stat{} : it->second;
}

std::vector<std::string> counter_names() {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<std::string> out;
  for (auto& [k, v] : r.counters) out.push_back(k);
  return out;
}

std::vector<std::string> stat_names() {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<std::string> out;
  for (auto& [k, v] : r.stats) out.push_back(k);
  return out;
}

std::string report() {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  std::string out = "Counters:\n";
  // The name padded to 28 columns (a longer one whole), as "%-28s" would.
  auto name = [](const std::string& k) { return "  " + k + std::string(k.size() < 28 ? 28 - k.size() : 0, ' ') + " "; };
  for (auto& [k, v] : r.counters) {
    out += name(k) + std::to_string(v);
    // The shares, where a device other than cpu:0 counted.
    std::string shares;
    bool other = false;
    for (auto& [dk, dv] : r.device_counters) {
      if (dk.name != k) continue;
      other = other || dk.device != 0;
      shares += (shares.empty() ? "" : ", ") + device_str(device_of(dk.device)) + " " + std::to_string(dv);
    }
    out += (other ? "  (" + shares + ")" : std::string()) + "\n";
  }
  out += "Stats:\n";
  for (auto& [k, s] : r.stats)
    out += name(k) + "count=" + std::to_string(s.count) + " total=" + format_value(k, s.total) +
           " mean=" + format_value(k, s.total / std::max<int64_t>(s.count, 1)) + " min=" + format_value(k, s.min) +
           " max=" + format_value(k, s.max) + "\n";
  return out;
}

void reset() {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  r.counters.clear();
  r.device_counters.clear();
  r.stats.clear();
}

}  // namespace loom::metrics
