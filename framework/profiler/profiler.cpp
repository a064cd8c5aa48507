#include <loom/profiler.h>

#include "profiler/track.h"

#include <loom/error.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <unistd.h>
#include <unordered_map>
#include <vector>

namespace loom::profiler {
namespace {

struct Span {
  const char* name;
  int64_t start_ns, end_ns;
  int tid;  // a thread's, or a track's (track.h): each is a row in the trace
};

struct Recorder {
  std::atomic<bool> running{false};
  std::mutex mutex;
  std::vector<Span> spans;
  std::unordered_map<int, std::string> thread_names;  // threads' and tracks' rows
  std::unordered_map<std::string, int> tracks;
  int next_tid = 1;
};

Recorder& recorder() {
  static auto* r = new Recorder;  // leaked: threads may record until exit
  return *r;
}

int thread_id() {
  thread_local int id = [] {
    auto& r = recorder();
    std::lock_guard lock(r.mutex);
    return r.next_tid++;
  }();
  return id;
}

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out;
}

}  // namespace

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

int track(const std::string& name) {
  auto& r = recorder();
  std::lock_guard lock(r.mutex);
  auto [it, made] = r.tracks.emplace(name, 0);
  if (made) {
    it->second = r.next_tid++;
    r.thread_names.emplace(it->second, name);
  }
  return it->second;
}

void add_span(int track, const char* name, int64_t start_ns, int64_t end_ns) {
  auto& r = recorder();
  std::lock_guard lock(r.mutex);
  r.spans.push_back({name, start_ns, end_ns, track});
}

void start() {
  auto& r = recorder();
  int tid = thread_id();
  {
    std::lock_guard lock(r.mutex);
    r.thread_names.emplace(tid, "host");
  }
  r.running = true;
}
void stop() { recorder().running = false; }
bool is_running() { return recorder().running; }

void clear() {
  auto& r = recorder();
  std::lock_guard lock(r.mutex);
  r.spans.clear();
}

std::size_t span_count() {
  auto& r = recorder();
  std::lock_guard lock(r.mutex);
  return r.spans.size();
}

void set_thread_name(const std::string& name) {
  auto& r = recorder();
  int tid = thread_id();
  std::lock_guard lock(r.mutex);
  r.thread_names[tid] = name;
}

Trace::Trace(const char* name) : name_(name ? name : ""), start_ns_(is_running() ? now_ns() : -1) {}

Trace::~Trace() {
  if (start_ns_ < 0) return;
  int64_t end = now_ns();
  auto& r = recorder();
  int tid = thread_id();
  std::lock_guard lock(r.mutex);
  r.spans.push_back({name_, start_ns_, end, tid});
}

void save(const std::string& path) {
  auto& r = recorder();
  std::ostringstream os;
  {
    std::lock_guard lock(r.mutex);
    int64_t origin = r.spans.empty() ? 0 : r.spans.front().start_ns;
    for (const auto& s : r.spans) origin = std::min(origin, s.start_ns);
    os << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
    bool first = true;
    for (const auto& [tid, name] : r.thread_names) {
      os << (first ? "" : ",\n") << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":" << tid
         << ",\"args\":{\"name\":\"" << escape(name) << "\"}}";
      first = false;
    }
    char buf[64];
    for (const auto& s : r.spans) {
      os << (first ? "" : ",\n") << "{\"name\":\"" << escape(s.name) << "\",\"ph\":\"X\",\"pid\":1,\"tid\":" << s.tid;
      std::snprintf(buf, sizeof buf, ",\"ts\":%.3f,\"dur\":%.3f}", (s.start_ns - origin) / 1e3,
                    (s.end_ns - s.start_ns) / 1e3);
      os << buf;
      first = false;
    }
    os << "\n]}\n";
  }
  // A name of this process's own, so that processes saving to one path (ranks on a shared
  // filesystem) never write into each other's file; the last rename wins, each file whole.
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) throw Error("profiler: cannot write '" + tmp + "'");
    f << os.str();
    if (!f.flush()) {
      std::remove(tmp.c_str());  // nothing half-written is left behind
      throw Error("profiler: failed writing '" + tmp + "'");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error("profiler: cannot rename '" + tmp + "' to '" + path + "'");
  }
}

}  // namespace loom::profiler
