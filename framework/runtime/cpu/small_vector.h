// Private to the CPU kernels: a vector of trivially copyable elements that keeps up to N of
// them in place and moves to the heap only past that. A kernel's index bookkeeping (the
// dimensions it walks, their strides, an odometer's digits) is a handful of numbers, and a
// std::vector for it would allocate on every call of the kernel (heap_count.h).
//
//   SmallVector<int64_t, 8> sizes;
//   for (auto d : shape) if (d > 1) sizes.push_back(d);
#pragma once

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <memory>
#include <type_traits>

namespace loom::runtime {

template <class T, std::size_t N>
class SmallVector {
  static_assert(std::is_trivially_copyable_v<T>, "SmallVector holds plain values");

 public:
  SmallVector() = default;
  explicit SmallVector(std::size_t n, T value = T()) { resize(n, value); }
  template <class It>
  SmallVector(It first, It last) {
    for (; first != last; ++first) push_back(*first);
  }
  SmallVector(const SmallVector& other) { *this = other; }
  SmallVector& operator=(const SmallVector& other) {
    if (this == &other) return *this;
    size_ = 0;
    reserve(other.size_);
    std::copy(other.begin(), other.end(), data());
    size_ = other.size_;
    return *this;
  }

  T* data() { return heap_ ? heap_.get() : inline_; }
  const T* data() const { return heap_ ? heap_.get() : inline_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  T& operator[](std::size_t i) {
    assert(i < size_ && "SmallVector: index out of range");
    return data()[i];
  }
  const T& operator[](std::size_t i) const {
    assert(i < size_ && "SmallVector: index out of range");
    return data()[i];
  }
  T& back() { return (*this)[size_ - 1]; }
  const T& back() const { return (*this)[size_ - 1]; }

  void push_back(T value) {
    reserve(size_ + 1);
    data()[size_++] = value;
  }
  void pop_back() {
    assert(size_ > 0 && "SmallVector: pop_back on an empty vector");
    --size_;
  }
  void insert_front(T value) {
    reserve(size_ + 1);
    std::copy_backward(begin(), end(), end() + 1);
    data()[0] = value;
    ++size_;
  }
  void resize(std::size_t n, T value = T()) {
    reserve(n);
    if (n > size_) std::fill(data() + size_, data() + n, value);
    size_ = n;
  }
  void clear() { size_ = 0; }

 private:
  void reserve(std::size_t n) {
    if (n <= capacity_) return;
    const std::size_t cap = std::max(n, 2 * capacity_);
    auto grown = std::make_unique<T[]>(cap);
    std::copy(begin(), end(), grown.get());
    heap_ = std::move(grown);
    capacity_ = cap;
  }

  T inline_[N];
  std::unique_ptr<T[]> heap_;
  std::size_t size_ = 0;
  std::size_t capacity_ = N;
};

}  // namespace loom::runtime
