#include <loom/checkpoint.h>
#include <loom/data/hdf5.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
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

// The first of the n values that is NaN or infinite, or -1.
template <class T>
int64_t first_non_finite(const T* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i])) return i;
  return -1;
}

int64_t first_non_finite(const HostTensor& h) {
  if (h.dtype == DType::Float32) return first_non_finite(h.data<float>(), h.numel());
  if (h.dtype == DType::Float64) return first_non_finite(h.data<double>(), h.numel());
  return -1;
}

// A key the index can hold (it is space- and line-separated) and HDF5 can name (no '/').
void check_key(const std::string& group, const std::string& name) {
  if (name.empty()) throw Error(group + ": a tensor has an empty name");
  for (unsigned char c : name)
    if (c <= ' ' || c == '/' || c == 0x7f)
      throw Error(group + ": the name '" + name + "' holds a space, a control character or '/'");
}

void write_group(data::HDF5Writer& w, const std::string& group,
                 const std::vector<std::pair<std::string, Tensor>>& tensors, std::ostringstream& index) {
  for (const auto& [name, t] : tensors) {
    check_key(group, name);
    auto h = t.to_host();
    // A run that diverged must not replace a good checkpoint with NaN weights.
    if (auto i = first_non_finite(h); i >= 0)
      throw Error(group + "/" + name + " holds a non-finite value (" + std::to_string(h.at(i)) + " at element " +
                  std::to_string(i) + ")");
    HostArray a(data::host_dtype(h.dtype), h.shape.empty() ? Shape{1} : h.shape);  // HDF5 needs a rank
    a.bytes = std::move(h.bytes);
    w.write(group + "/" + name, a);
    index << group << ' ' << name << ' ' << h.shape.size();
    for (auto d : h.shape) index << ' ' << d;
    index << '\n';
  }
}

void write_file(const std::string& tmp, const Checkpoint& ck) {
  data::HDF5Writer w(tmp, /*in_memory=*/true);
  std::ostringstream index;
  write_group(w, "model", ck.model, index);
  write_group(w, "optimizer", ck.optimizer, index);
  w.write("meta/index", bytes_of(index.str()));
  w.write("meta/model_name", bytes_of(ck.model_name));
  w.write("meta/options", bytes_of(ck.options));
  // [format version, step, epoch, batch_in_epoch, seed, optimizer_steps, batches_per_epoch,
  //  processes]
  w.write("meta/counters", HostArray::from_vector<int64_t>({3, ck.step, ck.epoch, ck.batch_in_epoch, ck.seed,
                                                            ck.optimizer_steps, ck.batches_per_epoch, ck.processes},
                                                           {8}));
  w.write("meta/lr", HostArray::from_vector<double>({ck.lr.value_or(std::nan(""))}, {1}));
  w.close();
}

}  // namespace

std::string checkpoint_temp_path(const std::string& path) { return path + ".tmp"; }

void save_checkpoint(const std::string& path, const Checkpoint& ck) {
  if (path.empty()) throw Error("save_checkpoint: expected a file name, got an empty one");
  const std::string tmp = checkpoint_temp_path(path);
  try {
    write_file(tmp, ck);
    // Durable before it replaces the last good checkpoint: the data, then the rename.
    data::sync_to_disk(tmp);
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) throw Error("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
  } catch (const std::exception& e) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);  // a partial file must not fill the disk
    std::string kept = std::filesystem::exists(path, ec) ? "the previous checkpoint is kept" : "nothing was saved";
    throw Error("save_checkpoint: '" + path + "' not written (" + kept + "): " + e.what());
  }
  auto dir = std::filesystem::path(path).parent_path();
  try {
    data::sync_to_disk(dir.empty() ? "." : dir.string(), /*directory=*/true);
  } catch (const Error& e) {
    throw Error("save_checkpoint: '" + path + "' was renamed into place, but " + e.what());
  }
}

Checkpoint load_checkpoint(const std::string& path) {
  if (!std::filesystem::exists(path)) throw Error("load_checkpoint: no such file '" + path + "'");
  Checkpoint ck;
  auto counters = data::read_hdf5(path, "meta/counters");
  auto c = reinterpret_cast<const int64_t*>(counters.bytes.data());
  // Version 1 had no batches_per_epoch and processes (read as 0: unknown).
  const int64_t version = counters.dtype == HostDType::Int64 && counters.numel() > 0 ? c[0] : 0;
  if (!((version == 1 && counters.numel() == 6) || ((version == 2 || version == 3) && counters.numel() == 8)))
    throw Error("load_checkpoint: '" + path + "' is not a loom checkpoint (meta/counters)");
  if (version >= 2) {
    ck.batches_per_epoch = c[6];
    ck.processes = c[7];
  }
  if (version >= 3) {
    auto lr = data::read_hdf5(path, "meta/lr");
    if (lr.dtype != HostDType::Float64 || lr.numel() != 1)
      throw Error("load_checkpoint: '" + path + "' meta/lr is not one float64");
    if (const double v = *reinterpret_cast<const double*>(lr.bytes.data()); !std::isnan(v)) ck.lr = v;
  }
  ck.step = c[1];
  ck.epoch = c[2];
  ck.batch_in_epoch = c[3];
  ck.seed = c[4];
  ck.optimizer_steps = c[5];
  auto text = [&](const char* name) {
    auto a = data::read_hdf5(path, name);
    if (a.dtype != HostDType::UInt8) throw Error("load_checkpoint: '" + path + "' " + name + " is not text");
    return string_of(a);
  };
  ck.model_name = text("meta/model_name");
  ck.options = text("meta/options");
  // The index: a line "<group> <name> <rank> <dims...>" per tensor, read to its end.
  std::istringstream index(text("meta/index"));
  std::set<std::string> seen;
  std::string line;
  int64_t line_number = 0;
  while (std::getline(index, line)) {
    ++line_number;
    const std::string bad = "load_checkpoint: '" + path + "' meta/index line " + std::to_string(line_number);
    std::istringstream fields(line);
    std::string group, name, extra;
    int64_t rank = -1;
    if (!(fields >> group >> name >> rank) || (group != "model" && group != "optimizer") || rank < 0 || rank > 16)
      throw Error(bad + " is not '<model|optimizer> <name> <rank> <sizes>': '" + line + "'");
    Shape shape(static_cast<std::size_t>(rank));
    for (auto& d : shape)
      if (!(fields >> d) || d < 1) throw Error(bad + " has no positive size for each of its " + std::to_string(rank) + " dimensions");
    if (fields >> extra) throw Error(bad + " has more than " + std::to_string(rank) + " sizes");
    const std::string where = "'" + path + "' " + group + "/" + name;
    if (!seen.insert(group + "/" + name).second) throw Error("load_checkpoint: " + where + " is in the index twice");
    auto a = data::read_hdf5(path, group + "/" + name);
    // Stored as written: a 0-d tensor as [1].
    if (a.shape != (shape.empty() ? Shape{1} : shape))
      throw Error("load_checkpoint: " + where + " is " + a.str() + ", the index says " + shape_str(shape));
    // As save_checkpoint refuses to write them.
    int64_t bad_at = -1;
    if (a.dtype == HostDType::Float32) bad_at = first_non_finite(a.data<float>(), a.numel());
    if (a.dtype == HostDType::Float64) bad_at = first_non_finite(a.data<double>(), a.numel());
    if (bad_at >= 0)
      throw Error("load_checkpoint: " + where + " holds a non-finite value at element " + std::to_string(bad_at));
    auto t = from_host(a.bytes.data(), loom_dtype(a.dtype, where), shape);
    (group == "model" ? ck.model : ck.optimizer).emplace_back(name, t);
  }
  return ck;
}

}  // namespace loom
