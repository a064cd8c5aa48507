// A strict JSON syntax checker for tests (enough to know that Perfetto and chrome://tracing
// can parse a trace), so the suite needs no JSON library.
#pragma once

#include <cctype>
#include <string>

namespace loom::test {

class JsonChecker {
 public:
  explicit JsonChecker(const std::string& s) : s_(s) {}
  bool valid() {
    ws();
    if (!value()) return false;
    ws();
    return i_ == s_.size();
  }

 private:
  void ws() { while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_; }
  bool lit(const char* w) {
    std::string x(w);
    if (s_.compare(i_, x.size(), x) != 0) return false;
    i_ += x.size();
    return true;
  }
  bool str() {
    if (s_[i_] != '"') return false;
    for (++i_; i_ < s_.size(); ++i_) {
      if (s_[i_] == '\\') { ++i_; continue; }
      if (s_[i_] == '"') { ++i_; return true; }
      if (static_cast<unsigned char>(s_[i_]) < 0x20) return false;
    }
    return false;
  }
  bool num() {
    std::size_t start = i_;
    if (s_[i_] == '-') ++i_;
    while (i_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[i_])) || s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E' || s_[i_] == '+' || s_[i_] == '-')) ++i_;
    return i_ > start;
  }
  bool seq(char close, bool object) {
    ++i_;
    ws();
    if (s_[i_] == close) { ++i_; return true; }
    for (;;) {
      ws();
      if (object) {
        if (!str()) return false;
        ws();
        if (s_[i_++] != ':') return false;
        ws();
      }
      if (!value()) return false;
      ws();
      if (s_[i_] == ',') { ++i_; continue; }
      if (s_[i_] == close) { ++i_; return true; }
      return false;
    }
  }
  bool value() {
    if (i_ >= s_.size()) return false;
    switch (s_[i_]) {
      case '{': return seq('}', true);
      case '[': return seq(']', false);
      case '"': return str();
      case 't': return lit("true");
      case 'f': return lit("false");
      case 'n': return lit("null");
      default: return num();
    }
  }
  const std::string& s_;
  std::size_t i_ = 0;
};

}  // namespace loom::test
