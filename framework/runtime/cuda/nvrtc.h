// Run-time compilation of generated CUDA C (codegen.h) with NVRTC, to a cubin for one GPU
// architecture, cached in memory and on disk. The key is the source, the architecture and
// NVRTC's version, so a warm start compiles nothing and a new toolkit recompiles.
//
//   auto cubin = nvrtc::compile(code.source, 90);   // sm_90, the H100
//
// The disk cache is the directory LOOM_CUDA_CACHE_DIR, by default $XDG_CACHE_HOME/loom/cuda
// (~/.cache/loom/cuda); LOOM_CUDA_CACHE_DIR=off keeps the cache in memory only. A cache
// file that cannot be written costs only the next start's compile (a warning, once).
// Compiling needs no GPU.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace loom::runtime::cuda::nvrtc {

using Binary = std::shared_ptr<const std::vector<char>>;

// `arch` is the compute capability as major * 10 + minor (90 for sm_90). Throws loom::Error
// with NVRTC's log (and the offending source lines) when the source does not compile.
Binary compile(const std::string& source, int arch);

// NVRTC's version, major * 1000 + minor * 10 (as CUDART_VERSION).
int version();

// Compiles that went to NVRTC and loads served from disk, since the process started.
struct CacheStats {
  int compiled = 0, from_disk = 0, from_memory = 0;
};
CacheStats cache_stats();

}  // namespace loom::runtime::cuda::nvrtc
