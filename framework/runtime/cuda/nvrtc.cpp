// NVRTC compiles, with the two caches of nvrtc.h. The disk cache holds one file per key,
// written to a temporary name and renamed, so a reader never sees half a file and two
// processes that compile the same source at once both end with a whole one.
#include "runtime/cuda/nvrtc.h"

#include "lazy/debug.h"
#include "runtime/cuda/cuda_check.h"

#include <loom/error.h>

#include <nvrtc.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <unistd.h>

namespace loom::runtime::cuda::nvrtc {
namespace {

namespace fs = std::filesystem;

// Two independent 64-bit FNV-1a hashes of the text: a 128-bit key, so that two sources
// meeting in one file name is not a practical concern.
std::string key_of(const std::string& source, int arch) {
  uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull;
  for (unsigned char c : source) {
    a = (a ^ c) * 0x100000001b3ull;
    b = (b ^ c) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;
  }
  char buf[80];
  std::snprintf(buf, sizeof buf, "sm%d-nvrtc%d-%016llx%016llx", arch, version(),
                static_cast<unsigned long long>(a), static_cast<unsigned long long>(b));
  return buf;
}

fs::path cache_dir() {
  if (const char* d = std::getenv("LOOM_CUDA_CACHE_DIR"); d && *d) {
    if (std::string(d) == "off") return {};
    return d;
  }
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return fs::path(x) / "loom" / "cuda";
  if (const char* h = std::getenv("HOME"); h && *h) return fs::path(h) / ".cache" / "loom" / "cuda";
  return {};
}

struct Cache {
  std::mutex mutex;
  std::map<std::string, Binary> memory;
  CacheStats stats;
};
Cache& cache() {
  static Cache c;
  return c;
}

Binary read_file(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return nullptr;
  auto data = std::make_shared<std::vector<char>>(std::istreambuf_iterator<char>(f),
                                                  std::istreambuf_iterator<char>());
  if (!f.good() && !f.eof()) return nullptr;
  return data->empty() ? nullptr : data;
}

void write_file(const fs::path& dir, const std::string& key, const std::vector<char>& data) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  const auto tmp = dir / (key + ".tmp" + std::to_string(::getpid()));
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
    if (!f) ec = std::make_error_code(std::errc::io_error);
  }
  if (!ec) fs::rename(tmp, dir / (key + ".cubin"), ec);
  if (ec) {
    fs::remove(tmp, ec);
    debug::warn_once("nvrtc cache", "loom: cannot write the CUDA kernel cache in " +
                                        dir.string() + " (" + ec.message() +
                                        "); kernels will be compiled again at the next start. "
                                        "Set LOOM_CUDA_CACHE_DIR to a writable directory.");
  }
}

// NVRTC's log with the source lines it names, numbered, so a failed compile says where.
std::string failure(nvrtcProgram prog, const std::string& source) {
  std::size_t n = 0;
  nvrtcGetProgramLogSize(prog, &n);
  std::string log(n, '\0');
  if (n) nvrtcGetProgramLog(prog, log.data());
  std::ostringstream msg;
  msg << "NVRTC could not compile the generated CUDA kernels:\n" << log;
  // The first line the log names: "...(123): error ..." shows lines 120..126.
  if (auto open = log.find('('); open != std::string::npos) {
    const long line = std::strtol(log.c_str() + open + 1, nullptr, 10);
    std::istringstream in(source);
    std::string text;
    for (long k = 1; std::getline(in, text); ++k)
      if (k >= line - 3 && k <= line + 3) msg << "\n" << k << ": " << text;
  }
  return msg.str();
}

Binary run_nvrtc(const std::string& source, int arch) {
  nvrtcProgram prog = nullptr;
  check(nvrtcCreateProgram(&prog, source.c_str(), "loom_program.cu", 0, nullptr, nullptr),
        "nvrtcCreateProgram");
  const std::string gpu = "--gpu-architecture=sm_" + std::to_string(arch);
  // No -use_fast_math: exp, log, division and sqrt are IEEE, as on the CPU. No contraction
  // of a * b + c into one fma either: each op rounds once, as in the CPU's kernels, so a fused
  // kernel gives the bits of the same ops run one by one (eager mode).
  const char* options[] = {gpu.c_str(), "--std=c++17", "--device-as-default-execution-space",
                           "--fmad=false"};
  const auto status = nvrtcCompileProgram(prog, 4, options);
  if (status != NVRTC_SUCCESS) {
    auto msg = failure(prog, source);
    nvrtcDestroyProgram(&prog);
    throw Error(msg);
  }
  std::size_t size = 0;
  check(nvrtcGetCUBINSize(prog, &size), "nvrtcGetCUBINSize");
  auto data = std::make_shared<std::vector<char>>(size);
  check(nvrtcGetCUBIN(prog, data->data()), "nvrtcGetCUBIN");
  nvrtcDestroyProgram(&prog);
  return data;
}

}  // namespace

int version() {
  int major = 0, minor = 0;
  check(nvrtcVersion(&major, &minor), "nvrtcVersion");
  return major * 1000 + minor * 10;
}

Binary compile(const std::string& source, int arch) {
  const auto key = key_of(source, arch);
  auto& c = cache();
  {
    std::lock_guard lock(c.mutex);
    if (auto it = c.memory.find(key); it != c.memory.end()) {
      ++c.stats.from_memory;
      return it->second;
    }
  }
  const auto dir = cache_dir();
  Binary bin = dir.empty() ? nullptr : read_file(dir / (key + ".cubin"));
  const bool from_disk = bin != nullptr;
  if (!bin) {
    bin = run_nvrtc(source, arch);
    if (!dir.empty()) write_file(dir, key, *bin);
  }
  std::lock_guard lock(c.mutex);
  ++(from_disk ? c.stats.from_disk : c.stats.compiled);
  return c.memory.emplace(key, bin).first->second;
}

CacheStats cache_stats() {
  std::lock_guard lock(cache().mutex);
  return cache().stats;
}

}  // namespace loom::runtime::cuda::nvrtc
