// The HDF5 boundary: one process-wide lock, error stacks turned into loom::Error, type mapping.
#include "hdf5_util.h"

#include <loom/error.h>

#include <vector>

namespace loom::data {

std::mutex& hdf5_mutex() {
  static auto* m = new std::mutex;  // leaked: HDF5 handles may be closed during exit
  return *m;
}

namespace detail {

Hdf5Lock::Hdf5Lock() : lock_(hdf5_mutex()) { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

namespace {

herr_t collect(unsigned, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::vector<std::string>*>(data);
  std::string desc = err->desc ? err->desc : "";
  if (desc.empty()) {
    char minor[256] = "";
    if (H5Eget_msg(err->min_num, nullptr, minor, sizeof minor) > 0) desc = minor;
  }
  out->push_back(std::move(desc));
  return 0;
}

}  // namespace

std::string hdf5_error_message() {
  std::vector<std::string> entries;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect, &entries);
  H5Eclear2(H5E_DEFAULT);
  // Downward walk: the API call first, the innermost cause last.
  for (auto it = entries.rbegin(); it != entries.rend(); ++it)
    if (!it->empty()) return *it;
  return {};
}

void throw_hdf5(const std::string& context, const std::string& what) {
  std::string msg = hdf5_error_message();
  throw Error(context + ": " + what + (msg.empty() ? "" : ": " + msg));
}

herr_t Handle::close() {
  if (id_ < 0) return 0;
  herr_t status = -1;
  switch (H5Iget_type(id_)) {
    case H5I_FILE: status = H5Fclose(id_); break;
    case H5I_GROUP: status = H5Gclose(id_); break;
    case H5I_DATASET: status = H5Dclose(id_); break;
    case H5I_DATASPACE: status = H5Sclose(id_); break;
    case H5I_DATATYPE: status = H5Tclose(id_); break;
    case H5I_ATTR: status = H5Aclose(id_); break;
    case H5I_GENPROP_LST: status = H5Pclose(id_); break;
    default: status = H5Oclose(id_); break;
  }
  id_ = -1;
  return status;
}

std::optional<HostDType> host_dtype_of_h5(hid_t type) {
  const H5T_class_t cls = H5Tget_class(type);
  const std::size_t size = H5Tget_size(type);
  if (cls == H5T_INTEGER) {
    const bool is_signed = H5Tget_sign(type) == H5T_SGN_2;
    if (!is_signed && size == 1) return HostDType::UInt8;
    if (is_signed && size == 4) return HostDType::Int32;
    if (is_signed && size == 8) return HostDType::Int64;
  } else if (cls == H5T_FLOAT) {
    if (size == 4) return HostDType::Float32;
    if (size == 8) return HostDType::Float64;
  }
  return std::nullopt;
}

std::string h5_type_name(hid_t type) {
  const std::string bits = std::to_string(8 * H5Tget_size(type));
  switch (H5Tget_class(type)) {
    case H5T_INTEGER: return (H5Tget_sign(type) == H5T_SGN_2 ? "int" : "uint") + bits;
    case H5T_FLOAT: return "float" + bits;
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return "enum";
    case H5T_ARRAY: return "array";
    case H5T_VLEN: return "vlen";
    case H5T_BITFIELD: return "bitfield" + bits;
    case H5T_OPAQUE: return "opaque";
    case H5T_REFERENCE: return "reference";
    case H5T_TIME: return "time";
    case H5T_NO_CLASS:
    case H5T_NCLASSES: break;
  }
  return "unknown";
}

hid_t native_h5_type(HostDType t) {
  switch (t) {
    case HostDType::UInt8: return H5T_NATIVE_UINT8;
    case HostDType::Int32: return H5T_NATIVE_INT32;
    case HostDType::Int64: return H5T_NATIVE_INT64;
    case HostDType::Float32: return H5T_NATIVE_FLOAT;
    case HostDType::Float64: return H5T_NATIVE_DOUBLE;
    case HostDType::Bool: return H5T_NATIVE_HBOOL;
  }
  return -1;
}

hid_t file_h5_type(HostDType t) {
  switch (t) {
    case HostDType::UInt8: return H5T_STD_U8LE;
    case HostDType::Int32: return H5T_STD_I32LE;
    case HostDType::Int64: return H5T_STD_I64LE;
    case HostDType::Float32: return H5T_IEEE_F32LE;
    case HostDType::Float64: return H5T_IEEE_F64LE;
    case HostDType::Bool: return H5T_STD_U8LE;
  }
  return -1;
}

bool path_exists(hid_t file, const std::string& path) {
  std::string prefix;
  std::size_t pos = 0;
  while (pos <= path.size()) {
    std::size_t next = path.find('/', pos);
    if (next == std::string::npos) next = path.size();
    std::string part = path.substr(pos, next - pos);
    pos = next + 1;
    if (part.empty()) continue;
    prefix += (prefix.empty() && path[0] != '/' ? "" : "/") + part;
    if (H5Lexists(file, prefix.c_str(), H5P_DEFAULT) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return false;
    }
  }
  return !prefix.empty();
}

}  // namespace detail
}  // namespace loom::data
