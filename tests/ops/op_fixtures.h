// The PyTorch reference fixtures of the op tests (ops/fixtures/*.txt): reading them and
// turning their tensors into loom tensors. The file format is described in
// tests/reference/make_op_fixtures.py.
//
//   const Fixtures f = read_fixtures(LOOM_TEST_DATA_DIR "/ops/fixtures/op_forward.txt");
//   ASSERT_TRUE(f.error.empty()) << f.error;
//   Tensor x = make_tensor(f.cases[0].inputs[0], DType::Float32);
#pragma once

#include "test_device.h"

#include <loom/bfloat16.h>
#include <loom/tensor.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <zlib.h>

namespace loom::test {

// ---- generated inputs ----

// The input generator of tests/reference/make_fast_path_fixtures.py, repeated exactly: the
// integer k of element i is splitmix64(seed * 2^32 + i) mod 1025 - 512, and its value k/256
// (exact in float32 and float64); in mode "inf" k = +-512 is +-Inf, in mode "nan" also
// k = 511 is NaN. Integer arithmetic mod 2^64 and an exact division: the same bits as Python.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Fills `values` with n generated elements; returns the sum of their k, which the fixture
// line states so that a generator that drifted from the script's is caught.
inline int64_t generate_values(uint64_t seed, const std::string& mode, int64_t n,
                               std::vector<double>& values) {
  if (mode != "finite" && mode != "inf" && mode != "nan") {
    throw std::runtime_error("unknown generator mode '" + mode + "'");
  }
  int64_t sum = 0;
  values.resize(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = static_cast<int64_t>(splitmix64((seed << 32) + static_cast<uint64_t>(i)) % 1025) - 512;
    sum += k;
    double v = static_cast<double>(k) / 256.0;
    if (mode != "finite" && (k == 512 || k == -512)) v = k > 0 ? INFINITY : -INFINITY;
    if (mode == "nan" && k == 511) v = NAN;
    values[static_cast<std::size_t>(i)] = v;
  }
  return sum;
}

// ---- fixture file ----

struct TensorSpec {
  std::string dtype;  // float | float_other | int64 | int32 | bool
  Shape shape;
  std::vector<double> values;
};

struct Case {
  std::string name;
  std::string op;
  std::map<std::string, std::string> params;
  std::vector<TensorSpec> inputs;
  TensorSpec output;
  bool has_output = false;
  int line = 0;
};

struct Fixtures {
  std::vector<Case> cases;
  std::string error;  // first problem found while reading; empty when the file is sound
  long declared_count = -1;
};

inline double parse_number(const std::string& token, bool integral) {
  const char* begin = token.c_str();
  char* end = nullptr;
  double v = 0;
  if (integral) {
    v = static_cast<double>(std::strtoll(begin, &end, 10));
  } else {
    v = std::strtod(begin, &end);
  }
  if (token.empty() || *end != '\0') throw std::runtime_error("bad number '" + token + "'");
  return v;
}

inline TensorSpec parse_tensor(std::istringstream& in) {
  TensorSpec t;
  long rank = -1;
  if (!(in >> t.dtype >> rank) || rank < 0) throw std::runtime_error("bad tensor header");
  const bool integral = t.dtype == "int64" || t.dtype == "int32" || t.dtype == "bool";
  if (!integral && t.dtype != "float" && t.dtype != "float_other") {
    throw std::runtime_error("unknown dtype '" + t.dtype + "'");
  }
  int64_t numel = 1;
  for (long d = 0; d < rank; ++d) {
    int64_t n = -1;
    if (!(in >> n) || n < 0) throw std::runtime_error("bad dimension");
    t.shape.push_back(n);
    numel *= n;
  }
  std::string token;
  while (in >> token) {
    if (token == "gen" && t.values.empty()) {  // gen <seed> <mode> <sum of k>
      uint64_t seed = 0;
      std::string mode;
      int64_t want_sum = 0;
      if (!(in >> seed >> mode >> want_sum) || (in >> token)) {
        throw std::runtime_error("bad gen spec");
      }
      const int64_t sum = generate_values(seed, mode, numel, t.values);
      if (sum != want_sum) {
        throw std::runtime_error("generated inputs (seed " + std::to_string(seed) + ") sum to " +
                                 std::to_string(sum) + ", the fixture says " +
                                 std::to_string(want_sum) + ": the generator drifted");
      }
      return t;
    }
    t.values.push_back(parse_number(token, integral));
  }
  if (static_cast<int64_t>(t.values.size()) != numel) {
    throw std::runtime_error("expected " + std::to_string(numel) + " values for shape " +
                             loom::shape_str(t.shape) + ", got " +
                             std::to_string(t.values.size()));
  }
  return t;
}

// The whole file, gunzipped when its name ends in ".gz"; false when it cannot be read.
inline bool read_text(const std::string& path, std::string& text) {
  const bool gz = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  if (!gz) {
    std::ifstream file(path, std::ios::binary);
    if (!file) return false;
    std::ostringstream ss;
    ss << file.rdbuf();
    text = ss.str();
    return true;
  }
  gzFile file = gzopen(path.c_str(), "rb");
  if (!file) return false;
  char buf[1 << 16];
  int n = 0;
  while ((n = gzread(file, buf, sizeof buf)) > 0) text.append(buf, static_cast<std::size_t>(n));
  const bool ok = n == 0;
  gzclose(file);
  return ok;
}

inline Fixtures read_fixtures(const std::string& path) {
  Fixtures f;
  std::string whole;
  if (!read_text(path, whole)) {
    f.error = "cannot open " + path;
    return f;
  }
  std::istringstream file(whole);
  std::string text;
  int line_no = 0;
  try {
    while (std::getline(file, text)) {
      ++line_no;
      if (text.empty() || text[0] == '#') continue;
      if (f.declared_count >= 0) throw std::runtime_error("content after 'end'");
      std::istringstream in(text);
      std::string kind;
      in >> kind;
      if (kind == "case") {
        if (!f.cases.empty() && !f.cases.back().has_output) {
          throw std::runtime_error("case " + f.cases.back().name + " has no 'out' line");
        }
        Case c;
        c.line = line_no;
        if (!(in >> c.name >> c.op)) throw std::runtime_error("bad case line");
        f.cases.push_back(std::move(c));
        continue;
      }
      if (kind == "end") {
        if (!(in >> f.declared_count)) throw std::runtime_error("bad end line");
        continue;
      }
      if (f.cases.empty()) throw std::runtime_error("'" + kind + "' before the first case");
      Case& c = f.cases.back();
      if (c.has_output) throw std::runtime_error("'" + kind + "' after the case's 'out'");
      if (kind == "params") {
        std::string kv;
        while (in >> kv) {
          auto eq = kv.find('=');
          if (eq == std::string::npos || eq == 0) throw std::runtime_error("bad param " + kv);
          c.params[kv.substr(0, eq)] = kv.substr(eq + 1);
        }
      } else if (kind == "in") {
        c.inputs.push_back(parse_tensor(in));
      } else if (kind == "out") {
        c.output = parse_tensor(in);
        c.has_output = true;
      } else {
        throw std::runtime_error("unknown line kind '" + kind + "'");
      }
    }
    if (!f.cases.empty() && !f.cases.back().has_output) {
      throw std::runtime_error("case " + f.cases.back().name + " has no 'out' line");
    }
    if (f.declared_count < 0) throw std::runtime_error("no 'end' line (truncated file?)");
    if (f.declared_count != static_cast<long>(f.cases.size())) {
      throw std::runtime_error("'end' declares " + std::to_string(f.declared_count) +
                               " cases, read " + std::to_string(f.cases.size()));
    }
  } catch (const std::exception& e) {
    f.error = path + ":" + std::to_string(line_no) + ": " + e.what();
  }
  return f;
}

// ---- building inputs ----

inline DType other_float(DType t) { return t == DType::Float64 ? DType::Float32 : DType::Float64; }

inline DType resolve_dtype(const std::string& token, DType run) {
  if (token == "float") return run;
  if (token == "float_other") return other_float(run);
  if (token == "int64") return DType::Int64;
  if (token == "int32") return DType::Int32;
  if (token == "bool") return DType::Bool;
  throw std::runtime_error("unknown dtype token '" + token + "'");
}

// `t` on the device the tests run on (test_device.h): the CPU unless LOOM_TEST_DEVICE names one.
inline Tensor on_test_device(const Tensor& t) {
  const loom::Device device = loom::test::test_device();
  return device == loom::Device{} ? t : t.to(device);
}

inline Tensor make_tensor(const TensorSpec& spec, DType run) {
  const DType dt = resolve_dtype(spec.dtype, run);
  const std::size_t width = loom::dtype_size(dt);
  std::vector<unsigned char> bytes(std::max<std::size_t>(1, spec.values.size() * width));
  for (std::size_t i = 0; i < spec.values.size(); ++i) {
    unsigned char* dst = bytes.data() + i * width;
    const double v = spec.values[i];
    switch (dt) {
      case DType::Float32: { float x = static_cast<float>(v); std::memcpy(dst, &x, width); break; }
      case DType::Float64: { double x = v; std::memcpy(dst, &x, width); break; }
      case DType::Int64: { int64_t x = static_cast<int64_t>(v); std::memcpy(dst, &x, width); break; }
      case DType::Int32: { int32_t x = static_cast<int32_t>(v); std::memcpy(dst, &x, width); break; }
      case DType::Bool: { bool x = v != 0; std::memcpy(dst, &x, width); break; }
      case DType::BFloat16: { loom::bfloat16 x(static_cast<float>(v)); std::memcpy(dst, &x, width); break; }
    }
  }
  return on_test_device(loom::from_host(bytes.data(), dt, spec.shape));
}

// ---- comparison ----

struct Tolerance {
  double rel;
  double abs;
};

inline bool close(double got, double want, Tolerance tol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= tol.abs + tol.rel * std::fabs(want);
}

}  // namespace loom::test
