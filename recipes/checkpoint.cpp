#include <loom/checkpoint.h>
#include <loom/data/hdf5.h>

#include <cstdio>
#include <filesystem>
#include <sstream>

namespace loom {
namespace {

using data::HostArray;
using data::HostDType;

DType loom_dtype(HostDType t, const std::string& where) {
  if (auto d = data::device_dtype(t)) return *d;
  throw Error("load_checkpoint: " + where + " has an element type loom tensors cannot hold");
}

HostArray bytes_of(const std::string& s) {
  HostArray a(HostDType::UInt8, {static_cast<int64_t>(s.size()) + 1});  // never empty
  std::copy(s.begin(), s.end(), a.bytes.begin());
  return a;
}

std::string string_of(const HostArray& a) {
  std::string s(a.bytes.begin(), a.bytes.end());
  if (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

// HDF5 paths cannot hold '/' inside a name; state_dict keys use '.', so keep them as they are.
void write_group(data::HDF5Writer& w, const std::string& group,
                 const std::vector<std::pair<std::string, Tensor>>& tensors, std::ostringstream& index) {
  for (const auto& [name, t] : tensors) {
    auto h = t.to_host();
    HostArray a(data::host_dtype(h.dtype), h.shape.empty() ? Shape{1} : h.shape);  // HDF5 needs a rank
    a.bytes = std::move(h.bytes);
    w.write(group + "/" + name, a);
    index << group << ' ' << name << ' ' << h.shape.size();
    for (auto d : h.shape) index << ' ' << d;
    index << '\n';
  }
}

}  // namespace

void save_checkpoint(const std::string& path, const Checkpoint& ck) {
  if (path.empty()) throw Error("save_checkpoint: expected a file name, got an empty one");
  std::string tmp = path + ".tmp";
  {
    data::HDF5Writer w(tmp);
    std::ostringstream index;
    write_group(w, "model", ck.model, index);
    write_group(w, "optimizer", ck.optimizer, index);
    w.write("meta/index", bytes_of(index.str()));
    w.write("meta/model_name", bytes_of(ck.model_name));
    w.write("meta/options", bytes_of(ck.options));
    // [format version, step, epoch, batch_in_epoch, seed, optimizer_steps]
    w.write("meta/counters", HostArray::from_vector<int64_t>(
                                 {1, ck.step, ck.epoch, ck.batch_in_epoch, ck.seed, ck.optimizer_steps}, {6}));
    w.close();
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error("save_checkpoint: cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
}

Checkpoint load_checkpoint(const std::string& path) {
  if (!std::filesystem::exists(path)) throw Error("load_checkpoint: no such file '" + path + "'");
  Checkpoint ck;
  auto counters = data::read_hdf5(path, "meta/counters");
  auto c = reinterpret_cast<const int64_t*>(counters.bytes.data());
  if (counters.dtype != HostDType::Int64 || counters.numel() != 6 || c[0] != 1)
    throw Error("load_checkpoint: '" + path + "' is not a loom checkpoint (meta/counters)");
  ck.step = c[1];
  ck.epoch = c[2];
  ck.batch_in_epoch = c[3];
  ck.seed = c[4];
  ck.optimizer_steps = c[5];
  ck.model_name = string_of(data::read_hdf5(path, "meta/model_name"));
  ck.options = string_of(data::read_hdf5(path, "meta/options"));
  std::istringstream index(string_of(data::read_hdf5(path, "meta/index")));
  std::string group, name;
  std::size_t rank;
  while (index >> group >> name >> rank) {
    Shape shape(rank);
    for (auto& d : shape) index >> d;
    auto a = data::read_hdf5(path, group + "/" + name);
    auto where = "'" + path + "' " + group + "/" + name;
    if (a.numel() != shape_numel(shape))
      throw Error("load_checkpoint: " + where + " holds " + std::to_string(a.numel()) +
                  " values, the index says " + shape_str(shape));
    auto t = from_host(a.bytes.data(), loom_dtype(a.dtype, where), shape);
    (group == "model" ? ck.model : ck.optimizer).emplace_back(name, t);
  }
  return ck;
}

}  // namespace loom
