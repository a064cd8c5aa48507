// HostArray, Example and collate: the host-side data model of the loaders.
#include <loom/data/dataset.h>

#include "collate.h"

#include <cassert>

namespace loom::data {

const char* host_dtype_name(HostDType t) {
  switch (t) {
    case HostDType::UInt8: return "uint8";
    case HostDType::Int32: return "int32";
    case HostDType::Int64: return "int64";
    case HostDType::Float32: return "float32";
    case HostDType::Float64: return "float64";
    case HostDType::Bool: return "bool";
  }
  return "?";
}

std::size_t host_dtype_size(HostDType t) {
  switch (t) {
    case HostDType::UInt8: return 1;
    case HostDType::Int32: return 4;
    case HostDType::Int64: return 8;
    case HostDType::Float32: return 4;
    case HostDType::Float64: return 8;
    case HostDType::Bool: return 1;
  }
  return 0;
}

bool is_floating(HostDType t) { return t == HostDType::Float32 || t == HostDType::Float64; }

std::optional<DType> device_dtype(HostDType t) {
  switch (t) {
    case HostDType::UInt8: return std::nullopt;
    case HostDType::Int32: return DType::Int32;
    case HostDType::Int64: return DType::Int64;
    case HostDType::Float32: return DType::Float32;
    case HostDType::Float64: return DType::Float64;
    case HostDType::Bool: return DType::Bool;
  }
  return std::nullopt;
}

HostDType host_dtype(DType t) {
  switch (t) {
    case DType::Float32: return HostDType::Float32;
    case DType::Float64: return HostDType::Float64;
    case DType::Int64: return HostDType::Int64;
    case DType::Int32: return HostDType::Int32;
    case DType::Bool: return HostDType::Bool;
    case DType::BFloat16: break;
  }
  throw Error(std::string("host arrays hold no ") + dtype_name(t) +
              " (HDF5 has no such type): cast the tensor to float32 first");
}

HostArray::HostArray(HostDType dtype, Shape shape) : dtype(dtype), shape(std::move(shape)) {
  for (auto d : this->shape)
    if (d < 0) throw Error("HostArray: expected non-negative sizes, got " + shape_str(this->shape));
  std::size_t n = 0;
  if (__builtin_mul_overflow(static_cast<std::size_t>(numel()), host_dtype_size(dtype), &n))
    throw Error("HostArray: " + std::string(host_dtype_name(dtype)) + shape_str(this->shape) +
                " is more bytes than a 64-bit size counts");
  bytes.assign(n, 0);
}

void HostArray::check_type(HostDType requested) const {
  if (requested != dtype)
    throw Error(std::string("HostArray::data: requested ") + host_dtype_name(requested) +
                " elements from a " + host_dtype_name(dtype) + " array");
}

double HostArray::at(int64_t i) const {
  const unsigned char* p = bytes.data() + static_cast<std::size_t>(i) * element_size();
  switch (dtype) {
    case HostDType::UInt8: return *p;
    case HostDType::Int32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case HostDType::Int64: { int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    case HostDType::Float32: { float v; std::memcpy(&v, p, 4); return v; }
    case HostDType::Float64: { double v; std::memcpy(&v, p, 8); return v; }
    case HostDType::Bool: return *p ? 1 : 0;
  }
  return 0;
}

std::string HostArray::str() const { return host_dtype_name(dtype) + shape_str(shape); }

namespace {

std::string field_list(const Example& e) {
  std::string s;
  for (const auto& [name, a] : e) s += (s.empty() ? "" : ", ") + name;
  return s.empty() ? "none" : s;
}

}  // namespace

HostArray& Example::at(const std::string& name) {
  auto it = fields_.find(name);
  if (it == fields_.end())
    throw Error("example has no field '" + name + "' (fields: " + field_list(*this) + ")");
  return it->second;
}

const HostArray& Example::at(const std::string& name) const {
  return const_cast<Example*>(this)->at(name);
}

std::vector<std::string> Example::names() const {
  std::vector<std::string> out;
  for (const auto& [name, a] : fields_) out.push_back(name);
  return out;
}

void detail::collate_into(const std::vector<Example>& examples, const PlaceField& place,
                          std::span<const int64_t> ids) {
  if (examples.empty()) throw Error("collate: expected at least one example, got none");
  auto id = [&](int64_t i) { return std::to_string(ids.size() == examples.size() ? ids[static_cast<std::size_t>(i)] : i); };
  const Example& first = examples.front();
  const auto n = static_cast<int64_t>(examples.size());
  std::map<std::string, unsigned char*> out;
  for (const auto& [name, a] : first) {
    Shape shape{n};
    shape.insert(shape.end(), a.shape.begin(), a.shape.end());
    out[name] = place(name, a.dtype, shape, static_cast<std::size_t>(n) * a.bytes.size());
  }
  for (int64_t i = 0; i < n; ++i) {
    const Example& e = examples[static_cast<std::size_t>(i)];
    if (e.size() != first.size() || e.names() != first.names())
      throw Error("collate: sample " + id(i) + " has fields (" + field_list(e) + "), expected (" +
                  field_list(first) + ") as sample " + id(0));
    for (const auto& [name, a] : e) {
      const HostArray& ref = first.at(name);
      if (a.dtype != ref.dtype || a.shape != ref.shape)
        throw Error("collate: sample " + id(i) + " field '" + name + "' is " + a.str() + ", expected " + ref.str() +
                    " as sample " + id(0));
      assert(a.bytes.size() == ref.bytes.size());
      if (!a.bytes.empty())
        std::memcpy(out.at(name) + static_cast<std::size_t>(i) * a.bytes.size(), a.bytes.data(),
                    a.bytes.size());
    }
  }
}

Example collate(const std::vector<Example>& examples) {
  Example out;
  detail::collate_into(examples, [&](const std::string& name, HostDType dtype, const Shape& shape,
                                     std::size_t) {
    HostArray& a = out[name] = HostArray(dtype, shape);
    return a.bytes.data();
  });
  return out;
}

}  // namespace loom::data
