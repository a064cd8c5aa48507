// header_example_extract: turns the usage example that opens a public header into a .cpp that
// compiles it (tests/docs/CMakeLists.txt runs it at build time for every include/loom/**.h).
//
//   header_example_extract HEADER NAME GIVENS OUT
//
// The example is the first run of comment lines indented by at least three spaces ("//   ")
// before `#pragma once`; blank "//" lines inside it are kept when an indented line follows.
// GIVENS (a file, or "-" for none) declares what the example takes as given (`x`, `model`,
// `loader`): statements placed before the example, in the same function. The example goes in
// a function of its own, in a nested block (so it may declare names the givens use); one
// written as `int main() {` becomes that function itself. `#line` points compile errors at
// the header's own lines. The function is never called: the test is that it compiles and
// links.
#include <cctype>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

bool indented(const std::string& line) { return line.rfind("//   ", 0) == 0; }
// "//" and nothing else (trailing blanks allowed).
bool blank_comment(const std::string& line) {
  return line.rfind("//", 0) == 0 && line.find_first_not_of(" \t", 2) == std::string::npos;
}

int fail(const std::string& header, const std::string& why) {
  std::cerr << "header_example_extract: " << header << ": " << why << '\n';
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: header_example_extract HEADER NAME GIVENS OUT\n";
    return 2;
  }
  const std::string header = argv[1], name = argv[2], givens_path = argv[3], out_path = argv[4];
  std::ifstream in(header);
  if (!in) return fail(header, "cannot be read");

  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("#pragma once", 0) == 0) break;
    lines.push_back(line);
  }
  size_t begin = 0;
  while (begin < lines.size() && !indented(lines[begin])) ++begin;
  if (begin == lines.size())
    return fail(header, "no usage example before #pragma once (a block of comment lines indented \"//   \")");
  size_t end = begin;
  while (end < lines.size()) {
    if (indented(lines[end])) {
      ++end;
      continue;
    }
    size_t next = end;
    while (next < lines.size() && blank_comment(lines[next])) ++next;
    if (next > end && next < lines.size() && indented(lines[next])) {
      end = next;
      continue;
    }
    break;
  }

  std::string givens;
  if (givens_path != "-") {
    std::ifstream g(givens_path);
    if (!g) return fail(header, "the givens file " + givens_path + " cannot be read");
    std::stringstream ss;
    ss << g.rdbuf();
    givens = ss.str();
  }

  std::string id;
  for (char c : name) id += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  const std::string fn = "loom_header_example_" + id;

  std::ostringstream body;
  bool has_main = false;
  for (size_t i = begin; i < end; ++i) {
    std::string code = indented(lines[i]) ? lines[i].substr(5) : "";
    if (code.rfind("int main() {", 0) == 0) {
      has_main = true;
      code = "int " + fn + "_main() {\n" + givens + "#line " + std::to_string(i + 2) + " \"" + header + "\"";
    }
    body << code << '\n';
  }

  std::ostringstream out;
  out << "// Generated from " << header << " by header_example_extract: do not edit.\n"
      << "#include <loom/" << name << ">  // first: the header stands on its own\n"
      << "#include <loom/loom.h>\n"
      << "#include \"header_example_support.h\"\n"
      << "#pragma GCC diagnostic ignored \"-Wunused-variable\"\n"
      << "#pragma GCC diagnostic ignored \"-Wunused-but-set-variable\"\n"
      << "#pragma GCC diagnostic ignored \"-Wunused-local-typedefs\"\n"
      << "#pragma GCC diagnostic ignored \"-Wunused-function\"\n"
      << "#pragma GCC diagnostic ignored \"-Wunused-value\"\n"
      << "#pragma GCC diagnostic ignored \"-Wreturn-type\"  // an example written as main() may end without return\n\n";
  if (has_main) {
    out << "#line " << begin + 1 << " \"" << header << "\"\n" << body.str()
        << "void " << fn << "() { " << fn << "_main(); }\n";
  } else {
    out << "void " << fn << "() {\n" << givens << "{\n#line " << begin + 1 << " \"" << header << "\"\n"
        << body.str() << "}\n}\n";
  }
  out << "static const bool registered_ = loom_docs::register_example(\"" << name << "\", &" << fn << ");\n";

  std::ofstream o(out_path);
  o << out.str();
  if (!o) return fail(header, "cannot write " + out_path);
  return 0;
}
