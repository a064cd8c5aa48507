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

Hdf5Lock::Hdf5Lock() : lock_(hdf5_mutex()) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  static bool filters_registered = false;  // guarded by hdf5_mutex()
  if (!filters_registered) {
    register_lzf_filter();
    filters_registered = true;
  }
}

namespace {

struct ErrorEntry {
  std::string desc;
  bool plugin;  // from the plugin loader
};

// HDF5 builds some descriptions with ctime(), whose string ends in a newline ("time = Mon Nov
// 23 06:28:20 2026\n, filename = ..."): a loom error is one line.
std::string one_line(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\n' || c == '\r') continue;
    out += c == '\t' ? ' ' : c;
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

herr_t collect(unsigned, const H5E_error2_t* err, void* data) {
  auto* out = static_cast<std::vector<ErrorEntry>*>(data);
  std::string desc = err->desc ? err->desc : "";
  if (desc.empty()) {
    char minor[256] = "";
    if (H5Eget_msg(err->min_num, nullptr, minor, sizeof minor) > 0) desc = minor;
  }
  out->push_back({one_line(desc), err->maj_num == H5E_PLUGIN});
  return 0;
}

}  // namespace

std::string hdf5_error_message() {
  std::vector<ErrorEntry> entries;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect, &entries);
  H5Eclear2(H5E_DEFAULT);
  // Downward walk: the API call first, the innermost cause last. A missing filter ends in the
  // plugin loader's failed search ("can't open directory: .../plugins"), below the line that
  // names the filter ("required filter 'lzf' is not registered"): that line comes first.
  std::string cause, plugin;
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    if (it->desc.empty()) continue;
    if (!it->plugin) {
      cause = it->desc;
      break;
    }
    if (plugin.empty()) plugin = it->desc;
  }
  if (cause.empty()) return plugin;
  return plugin.empty() ? cause : cause + " (plugin search: " + plugin + ")";
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

namespace {

// Names of the filters HDF5 builds in, loom's LZF, and other ids registered with The HDF Group
// that h5py users meet (for files that do not store the name).
const char* known_filter_name(H5Z_filter_t id) {
  switch (id) {
    case H5Z_FILTER_DEFLATE: return "deflate";
    case H5Z_FILTER_SHUFFLE: return "shuffle";
    case H5Z_FILTER_FLETCHER32: return "fletcher32";
    case H5Z_FILTER_SZIP: return "szip";
    case H5Z_FILTER_NBIT: return "nbit";
    case H5Z_FILTER_SCALEOFFSET: return "scaleoffset";
    case 305: return "lzo";
    case 307: return "bzip2";
    case kLzfFilter: return "lzf";
    case 32001: return "blosc";
    case 32004: return "lz4";
    case 32008: return "bitshuffle";
    case 32013: return "zfp";
    case 32015: return "zstd";
    case 32017: return "sz";
    case 32026: return "blosc2";
    default: return nullptr;
  }
}

bool can_decode(H5Z_filter_t id) {
  unsigned config = 0;
  const bool ok = H5Zfilter_avail(id) > 0 && H5Zget_filter_info(id, &config) >= 0 &&
                  (config & H5Z_FILTER_CONFIG_DECODE_ENABLED) != 0;
  H5Eclear2(H5E_DEFAULT);
  return ok;
}

std::string decodable_filters() {
  std::string s;
  for (H5Z_filter_t id : {H5Z_FILTER_DEFLATE, H5Z_FILTER_SHUFFLE, H5Z_FILTER_FLETCHER32, H5Z_FILTER_SZIP,
                          H5Z_FILTER_NBIT, H5Z_FILTER_SCALEOFFSET, kLzfFilter})
    if (can_decode(id)) s += (s.empty() ? "" : ", ") + std::string(known_filter_name(id));
  return s;
}

}  // namespace

void check_filters(hid_t dcpl, const std::string& context) {
  const int n = check(H5Pget_nfilters(dcpl), context, "cannot read the filter pipeline");
  for (int i = 0; i < n; ++i) {
    unsigned flags = 0, config = 0;
    std::size_t values = 0;
    char stored[256] = "";
    const H5Z_filter_t id = check(H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &values, nullptr,
                                                 sizeof stored, stored, &config),
                                  context, "cannot read filter " + std::to_string(i) + " of the pipeline");
    const htri_t avail = H5Zfilter_avail(id);
    const std::string search = hdf5_error_message();  // the plugin loader's, when it looked
    if (avail > 0 && can_decode(id)) continue;
    const char* known = known_filter_name(id);
    std::string name = "(no name stored)";
    if (const char* shown = stored[0] ? stored : known) name = std::string(1, '\'') + shown + "'";
    std::string why = "which this HDF5 can only encode";
    if (avail <= 0)
      why = "which this HDF5 does not have" + (search.empty() ? "" : " (plugin search: " + search + ")");
    throw Error(context + ": compressed with HDF5 filter " + std::to_string(id) + " " + name + ", " + why +
                "; filters available: " + decodable_filters());
  }
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
