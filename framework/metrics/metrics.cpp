#include <loom/metrics.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>

namespace loom::metrics {
namespace {

struct Registry {
  std::mutex mutex;
  // std::less<> looks names up as string_views: no std::string is built for a lookup.
  std::map<std::string, int64_t, std::less<>> counters;
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

}  // namespace

void increment(std::string_view name, int64_t by) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.counters.find(name);
  if (it == r.counters.end()) r.counters.emplace(std::string(name), by);
  else it->second += by;
}

int64_t counter(std::string_view name) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.counters.find(name);
  return it == r.counters.end() ? 0 : it->second;
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
  char line[256];
  for (auto& [k, v] : r.counters) {
    std::snprintf(line, sizeof line, "  %-28s %lld\n", k.c_str(), static_cast<long long>(v));
    out += line;
  }
  out += "Stats:\n";
  for (auto& [k, s] : r.stats) {
    std::snprintf(line, sizeof line, "  %-28s count=%lld total=%s mean=%s min=%s max=%s\n",
                  k.c_str(), static_cast<long long>(s.count), format_value(k, s.total).c_str(),
                  format_value(k, s.total / std::max<int64_t>(s.count, 1)).c_str(),
                  format_value(k, s.min).c_str(), format_value(k, s.max).c_str());
    out += line;
  }
  return out;
}

void reset() {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  r.counters.clear();
  r.stats.clear();
}

}  // namespace loom::metrics
