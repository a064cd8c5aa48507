// prepare_data: converts datasets into the HDF5 files loom's loaders read.
//
//   prepare_data --fashion-mnist --output fashion_mnist.h5
//       IDX files (gzipped or not) of Debian's dataset-fashion-mnist → train/images uint8
//       [60000,1,28,28], train/labels int64 [60000], test/images, test/labels; chunked and
//       compressed; attribute num_classes.
//   prepare_data --text /usr/share/games/fortunes --output fortunes.h5 --val-fraction 0.05
//       plain text → byte-level tokens: train/tokens and val/tokens (1-D), attribute
//       vocab_size = 256. Directories are read file by file (sorted), skipping strfile's
//       binary .dat indexes and files already read through another name (symlinks).
//
// The output is written to OUTPUT.tmp and renamed when complete, so a crash never leaves a
// broken OUTPUT; an existing OUTPUT is kept unless --force. Errors are one line on stderr and
// exit status 1 (2 for bad options).
#include <loom/data/hdf5.h>
#include <loom/error.h>
#include <loom/openmp.h>

#include <boost/program_options.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <string>
#include <vector>

namespace fs = std::filesystem;
namespace po = boost::program_options;
using loom::Error;
using loom::data::HostArray;
using loom::data::HostDType;

namespace {

constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

struct Settings {
  std::string output;
  bool force = false;
  int64_t chunk_rows = 1024;
  int64_t token_chunk = 65536;
  int compression = 4;
  double val_fraction = 0.1;
  HostDType token_dtype = HostDType::UInt8;
};

// Logs "<what>: done/total (pct%)" about every 10%.
class Progress {
 public:
  Progress(std::string what, int64_t total) : what_(std::move(what)), total_(total) {}
  void update(int64_t done) {
    const int64_t tenth = total_ > 0 ? done * 10 / total_ : 10;
    if (tenth <= shown_) return;
    shown_ = tenth;
    spdlog::info("{}: {}/{} ({}%)", what_, done, total_, total_ > 0 ? done * 100 / total_ : 100);
  }

 private:
  std::string what_;
  int64_t total_;
  int64_t shown_ = -1;
};

// ---- IDX (the MNIST format): big-endian header, then raw unsigned bytes ----

class GzFile {
 public:
  explicit GzFile(const fs::path& path) : path_(path.string()), f_(gzopen(path_.c_str(), "rb")) {
    if (!f_) throw Error(path_ + ": cannot open for reading");
  }
  ~GzFile() {
    if (f_) gzclose(f_);
  }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Reads exactly n bytes (gzip or plain; zlib handles both), or throws naming `what`.
  void read(void* dst, std::size_t n, const std::string& what) {
    auto* p = static_cast<unsigned char*>(dst);
    std::size_t got = 0;
    while (got < n) {
      const auto want = static_cast<unsigned>(std::min<std::size_t>(n - got, 1u << 30));
      int r = gzread(f_, p + got, want);
      if (r < 0) {
        int err = 0;
        const char* msg = gzerror(f_, &err);
        throw Error(path_ + ": corrupt gzip data while reading " + what + ": " + (msg ? msg : "?"));
      }
      if (r == 0) break;
      got += static_cast<std::size_t>(r);
    }
    if (got != n)
      throw Error(path_ + ": truncated: expected " + std::to_string(n) + " bytes of " + what + ", got " +
                  std::to_string(got));
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  gzFile f_;
};

uint32_t big_endian(const unsigned char* b) {
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
}

// Reads an IDX header: magic 0x0000 08 <ndims> (unsigned bytes), then ndims big-endian sizes.
std::vector<int64_t> read_idx_header(GzFile& f, int expected_dims) {
  unsigned char magic[4];
  f.read(magic, 4, "the IDX magic number");
  const uint32_t m = big_endian(magic);
  const uint32_t expected = 0x00000800u | static_cast<uint32_t>(expected_dims);
  if (m != expected) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "0x%08X, expected 0x%08X", m, expected);
    throw Error(f.path() + ": bad IDX magic number " + buf + " (unsigned bytes, " +
                std::to_string(expected_dims) + " dimension" + (expected_dims > 1 ? "s" : "") + ")");
  }
  std::vector<int64_t> dims;
  for (int d = 0; d < expected_dims; ++d) {
    unsigned char b[4];
    f.read(b, 4, "the IDX dimensions");
    dims.push_back(big_endian(b));
  }
  return dims;
}

fs::path find_idx(const fs::path& dir, const std::string& stem) {
  for (const char* ext : {".gz", ""}) {
    fs::path p = dir / (stem + ext);
    if (fs::exists(p)) return p;
  }
  throw Error(dir.string() + ": missing " + stem + ".gz (Fashion-MNIST IDX file)");
}

// Converts one split (train or t10k → test); returns the largest label.
int64_t convert_split(loom::data::HDF5Writer& out, const fs::path& dir, const std::string& idx_name,
                      const std::string& split, const Settings& s) {
  GzFile images(find_idx(dir, idx_name + "-images-idx3-ubyte"));
  GzFile labels(find_idx(dir, idx_name + "-labels-idx1-ubyte"));
  const auto idims = read_idx_header(images, 3);
  const auto ldims = read_idx_header(labels, 1);
  const int64_t n = idims[0], rows = idims[1], cols = idims[2];
  if (n != ldims[0])
    throw Error(images.path() + " holds " + std::to_string(n) + " images but " + labels.path() + " holds " +
                std::to_string(ldims[0]) + " labels");
  if (n == 0 || rows == 0 || cols == 0) throw Error(images.path() + ": holds no images");
  spdlog::info("{}: {} images of {}x{} from {}", split, n, rows, cols, images.path());

  const loom::data::HDF5WriteOptions opts{.chunk_rows = s.chunk_rows, .deflate = s.compression};
  out.create(split + "/images", HostDType::UInt8, {n, 1, rows, cols}, opts);
  out.create(split + "/labels", HostDType::Int64, {n}, opts);

  Progress progress(split + "/images", n);
  const int64_t block = std::max<int64_t>(1, s.chunk_rows) * 8;
  std::vector<int64_t> counts;
  int64_t max_label = 0;
  for (int64_t first = 0; first < n; first += block) {
    const int64_t k = std::min(block, n - first);
    HostArray img(HostDType::UInt8, {k, 1, rows, cols});
    images.read(img.bytes.data(), img.bytes.size(), "image data");
    out.write_rows(split + "/images", first, img);

    std::vector<unsigned char> raw(static_cast<std::size_t>(k));
    labels.read(raw.data(), raw.size(), "label data");
    HostArray lab(HostDType::Int64, {k});
    for (int64_t i = 0; i < k; ++i) {
      const int64_t v = raw[static_cast<std::size_t>(i)];
      lab.data<int64_t>()[i] = v;
      max_label = std::max(max_label, v);
      if (static_cast<int64_t>(counts.size()) <= v) counts.resize(static_cast<std::size_t>(v + 1), 0);
      ++counts[static_cast<std::size_t>(v)];
    }
    out.write_rows(split + "/labels", first, lab);
    progress.update(first + k);
  }
  std::string hist;
  for (std::size_t c = 0; c < counts.size(); ++c) {
    if (c) hist += ' ';
    hist += std::to_string(counts[c]);
  }
  spdlog::info("{}/labels: {} classes, counts per class: {}", split, counts.size(), hist);
  return max_label;
}

void convert_fashion_mnist(const fs::path& dir, const std::string& tmp, const Settings& s) {
  if (!fs::is_directory(dir)) throw Error(dir.string() + ": no such directory (Fashion-MNIST IDX files)");
  loom::data::HDF5Writer out(tmp);
  const int64_t max_train = convert_split(out, dir, "train", "train", s);
  const int64_t max_test = convert_split(out, dir, "t10k", "test", s);
  out.set_attribute("/", "num_classes", std::max(max_train, max_test) + 1);
  out.close();
}

// ---- text → byte tokens ----

// Whether `p` starts with HDF5's signature (a file this program, or another, wrote).
bool is_hdf5(const fs::path& p) {
  static constexpr char kSignature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
  char head[8] = {};
  std::ifstream in(p, std::ios::binary);
  return in.read(head, sizeof head) && std::equal(head, head + 8, kSignature);
}

// The text files to read. `outputs` (the output and its temporary file) are never among them:
// an input that is one is an error, and a directory's entry that is one is left out, as is
// any HDF5 file there (the output of an earlier run into the corpus directory).
std::vector<fs::path> text_files(const std::vector<std::string>& inputs, const std::vector<fs::path>& outputs) {
  std::vector<fs::path> files;
  std::set<fs::path> seen;
  auto add = [&](const fs::path& p, bool explicit_file) {
    for (const auto& out : outputs) {
      std::error_code ec;
      if (!fs::equivalent(p, out, ec)) continue;
      if (explicit_file) throw Error("--text: '" + p.string() + "' is the --output file; it would be overwritten");
      return;
    }
    if (p.extension() == ".dat") {
      if (explicit_file) spdlog::warn("{}: skipped (a binary strfile index, not text)", p.string());
      return;
    }
    if (is_hdf5(p)) {
      spdlog::warn("{}: skipped (an HDF5 file, not text)", p.string());
      return;
    }
    const fs::path canonical = fs::canonical(p);
    if (!seen.insert(canonical).second) return;  // e.g. fortunes' .u8 symlinks
    files.push_back(p);
  };
  for (const auto& in : inputs) {
    const fs::path p(in);
    if (fs::is_directory(p)) {
      std::vector<fs::path> entries;
      for (const auto& e : fs::directory_iterator(p))
        if (e.is_regular_file() && e.path().filename().string().front() != '.') entries.push_back(e.path());
      std::sort(entries.begin(), entries.end());
      for (const auto& e : entries) add(e, false);
    } else if (fs::is_regular_file(p)) {
      add(p, true);
    } else {
      throw Error(in + ": no such file or directory");
    }
  }
  if (files.empty()) throw Error("--text: no text files found");
  return files;
}

void write_tokens(loom::data::HDF5Writer& out, const std::string& path, const std::vector<unsigned char>& bytes,
                  int64_t first, int64_t n, const Settings& s) {
  const loom::data::HDF5WriteOptions opts{.chunk_rows = s.token_chunk, .deflate = s.compression};
  out.create(path, s.token_dtype, {n}, opts);
  Progress progress(path, n);
  const int64_t block = std::max<int64_t>(1, s.token_chunk) * 16;
  for (int64_t start = 0; start < n; start += block) {
    const int64_t k = std::min(block, n - start);
    HostArray a(s.token_dtype, {k});
    const unsigned char* src = bytes.data() + first + start;
    if (s.token_dtype == HostDType::UInt8) std::copy(src, src + k, a.data<uint8_t>());
    else std::copy(src, src + k, a.data<int64_t>());
    out.write_rows(path, start, a);
    progress.update(start + k);
  }
  if (n == 0) progress.update(0);
}

void convert_text(const std::vector<std::string>& inputs, const std::string& tmp, const Settings& s) {
  const auto files = text_files(inputs, {fs::path(s.output), fs::path(tmp)});
  std::vector<unsigned char> bytes;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw Error(f.string() + ": cannot open for reading");
    std::vector<unsigned char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw Error(f.string() + ": read error");
    bytes.insert(bytes.end(), data.begin(), data.end());
  }
  const auto n = static_cast<int64_t>(bytes.size());
  const auto n_val = static_cast<int64_t>(std::llround(static_cast<double>(n) * s.val_fraction));
  const int64_t n_train = n - n_val;
  spdlog::info("text: {} bytes from {} files → {} train and {} validation tokens", n, files.size(), n_train, n_val);
  if (n_train < 2) throw Error("--text: too little text (" + std::to_string(n) + " bytes) for a training split");
  if (s.val_fraction > 0 && n_val < 2) spdlog::warn("text: the validation split holds only {} tokens", n_val);

  loom::data::HDF5Writer out(tmp);
  write_tokens(out, "train/tokens", bytes, 0, n_train, s);
  write_tokens(out, "val/tokens", bytes, n_train, n_val, s);
  out.set_attribute("/", "vocab_size", 256);
  out.close();
}

int run(int argc, char** argv) {
  Settings s;
  std::string token_dtype = "uint8";
  po::options_description desc(
      "prepare_data: converts Fashion-MNIST (IDX) or plain text into HDF5 files for loom's loaders.\n"
      "Usage:\n"
      "  prepare_data --fashion-mnist [DIR] --output fashion_mnist.h5\n"
      "  prepare_data --text FILE|DIR... --output tokens.h5 [--val-fraction F]\n"
      "Options");
  // clang-format off
  desc.add_options()
    ("help,h", "show this help and exit")
    ("fashion-mnist", po::value<std::string>()->implicit_value(kFashionMnistDir)->value_name("DIR"),
     "convert the Fashion-MNIST IDX files (train-*/t10k-*-idx?-ubyte, gzipped or not) in DIR "
     "(default /usr/share/datasets/fashion-mnist, as Debian's dataset-fashion-mnist ships them) "
     "into train/images uint8 [N,1,28,28], train/labels int64 [N], test/images, test/labels")
    ("text", po::value<std::vector<std::string>>()->multitoken()->value_name("FILE|DIR..."),
     "convert plain text files (directories: every file in them, skipping .dat indexes, HDF5 "
     "files and duplicate symlinks) into byte-level tokens train/tokens and val/tokens, vocab_size 256")
    ("output,o", po::value<std::string>(&s.output)->value_name("FILE"),
     "the HDF5 file to write (required); written as FILE.tmp, renamed when complete")
    ("force,f", po::bool_switch(&s.force), "overwrite FILE if it exists")
    ("val-fraction", po::value<double>(&s.val_fraction)->default_value(0.1, "0.1")->value_name("F"),
     "--text: share of the tokens (the end of the text) kept for validation, in [0, 1)")
    ("token-dtype", po::value<std::string>(&token_dtype)->default_value("uint8")->value_name("uint8|int64"),
     "--text: element type of the token datasets")
    ("chunk-rows", po::value<int64_t>(&s.chunk_rows)->default_value(1024)->value_name("N"),
     "--fashion-mnist: images (and labels) per HDF5 chunk")
    ("token-chunk", po::value<int64_t>(&s.token_chunk)->default_value(65536)->value_name("N"),
     "--text: tokens per HDF5 chunk")
    ("compression", po::value<int>(&s.compression)->default_value(4)->value_name("0-9"),
     "gzip (deflate) level; 0 stores uncompressed chunks")
    ("quiet,q", "log warnings and errors only (no progress)");
  // clang-format on
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, desc), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    spdlog::error("{} (see --help)", e.what());
    return 2;
  }
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  if (vm.count("quiet")) spdlog::set_level(spdlog::level::warn);
  auto usage = [](const std::string& msg) {
    spdlog::error("{} (see --help)", msg);
    return 2;
  };
  const bool mnist = vm.count("fashion-mnist") != 0, text = vm.count("text") != 0;
  if (mnist == text) return usage("give exactly one of --fashion-mnist [DIR] and --text FILE...");
  if (s.output.empty()) return usage("--output FILE is required");
  if (!(s.val_fraction >= 0 && s.val_fraction < 1)) return usage("--val-fraction must be in [0, 1)");
  if (token_dtype == "uint8") s.token_dtype = HostDType::UInt8;
  else if (token_dtype == "int64") s.token_dtype = HostDType::Int64;
  else return usage("--token-dtype must be uint8 or int64, got '" + token_dtype + "'");
  if (s.chunk_rows < 1 || s.token_chunk < 1) return usage("--chunk-rows and --token-chunk must be positive");
  if (s.compression < 0 || s.compression > 9) return usage("--compression must be in 0-9");

  const fs::path output(s.output);
  if (fs::is_directory(output)) {
    spdlog::error("{}: is a directory, expected a file name", s.output);
    return 1;
  }
  if (fs::exists(output) && !s.force) {
    spdlog::error("{}: exists; pass --force to overwrite it", s.output);
    return 1;
  }
  if (output.has_parent_path() && !fs::is_directory(output.parent_path())) {
    spdlog::error("{}: no such directory", output.parent_path().string());
    return 1;
  }
  const std::string tmp = s.output + ".tmp";
  try {
    if (mnist) convert_fashion_mnist(vm["fashion-mnist"].as<std::string>(), tmp, s);
    else convert_text(vm["text"].as<std::vector<std::string>>(), tmp, s);
    // On the disk before it replaces OUTPUT (a --force over a good file), and the rename too.
    loom::data::sync_to_disk(tmp);
    fs::rename(tmp, output);
    loom::data::sync_to_disk(output.has_parent_path() ? output.parent_path().string() : ".", /*directory=*/true);
  } catch (...) {
    std::error_code ec;
    fs::remove(tmp, ec);
    throw;
  }
  spdlog::info("wrote {} ({} bytes)", s.output, fs::file_size(output));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  loom::openmp_passive_or_reexec(argc, argv);
  auto logger = spdlog::stderr_color_st("prepare_data");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("prepare_data: %^%l%$: %v");
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
