// The CPU backend's caching allocator (allocator.h): block alignment, and transparent huge
// pages advised for large blocks.
#include "runtime/cpu/allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace loom::runtime {
namespace {

constexpr std::uintptr_t kHugePage = std::uintptr_t{2} << 20;

bool huge_pages_off() {
  const char* v = std::getenv("LOOM_HUGE_PAGES");
  return v && std::strcmp(v, "0") == 0;
}

// The VmFlags line of the mapping that holds `p` in /proc/self/smaps, or "" where there is
// none (not Linux, or a kernel without the field).
std::string vm_flags(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    std::uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = addr >= begin && addr < end;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

TEST(CpuAllocator, SmallBlocksAreCacheLineAligned) {
  for (std::size_t bytes : {1, 100, 4096, 100000}) {
    auto s = allocate(bytes);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(s->data()) % 64, 0u) << bytes << " bytes";
    EXPECT_GE(s->bytes(), bytes);
  }
}

// A step's large tensors (the memory plan's arena, parameters, optimizer state) start on a
// huge page and are advised for transparent huge pages ("hg" in the mapping's VmFlags), which
// Debian's default THP mode ("madvise") needs before it backs them with 2 MB pages.
TEST(CpuAllocator, LargeBlocksAreAdvisedForHugePages) {
  if (huge_pages_off()) GTEST_SKIP() << "LOOM_HUGE_PAGES=0 in the environment";
  auto s = allocate(3 * kHugePage + 123);
  std::memset(s->data(), 1, s->bytes());
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(s->data()) % kHugePage, 0u);
  if (!std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled"))
    GTEST_SKIP() << "this kernel has no transparent huge pages";
  const std::string flags = vm_flags(s->data());
  if (flags.empty()) GTEST_SKIP() << "no VmFlags in /proc/self/smaps on this system";
  EXPECT_NE((flags + " ").find(" hg "), std::string::npos) << flags;
  auto small = allocate(kHugePage / 4);
  const std::string small_flags = vm_flags(small->data());
  EXPECT_EQ((small_flags + " ").find(" hg "), std::string::npos)
      << "a block below a huge page is left as it is: " << small_flags;
}

}  // namespace
}  // namespace loom::runtime
