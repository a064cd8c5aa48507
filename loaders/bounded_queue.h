// A blocking FIFO of bounded capacity between the loader's pipeline thread and the consumer.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>

namespace loom::data::detail {

template <class T>
class BoundedQueue {
 public:
  explicit BoundedQueue(std::size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  // Blocks while full. False (and `item` dropped) once cancelled.
  bool push(T item) {
    std::unique_lock lock(mutex_);
    not_full_.wait(lock, [&] { return items_.size() < capacity_ || cancelled_; });
    if (cancelled_) return false;
    items_.push_back(std::move(item));
    not_empty_.notify_one();
    return true;
  }

  // Blocks while full; false once cancelled.
  bool wait_for_room() {
    std::unique_lock lock(mutex_);
    not_full_.wait(lock, [&] { return items_.size() < capacity_ || cancelled_; });
    return !cancelled_;
  }

  std::size_t size() {
    std::lock_guard lock(mutex_);
    return items_.size();
  }

  std::size_t capacity() const { return capacity_; }

  // Blocks while empty and not finished. nullopt once finished (or cancelled) and drained.
  std::optional<T> pop() {
    std::unique_lock lock(mutex_);
    not_empty_.wait(lock, [&] { return !items_.empty() || finished_ || cancelled_; });
    if (items_.empty()) return std::nullopt;
    T item = std::move(items_.front());
    items_.pop_front();
    not_full_.notify_one();
    return item;
  }

  // Producer: nothing more will come; pop() drains what is queued, then ends.
  void finish() {
    std::lock_guard lock(mutex_);
    finished_ = true;
    not_empty_.notify_all();
  }

  // Consumer: wake every waiter, fail all future pushes, and drop what is queued.
  void cancel() {
    std::deque<T> dropped;
    {
      std::lock_guard lock(mutex_);
      cancelled_ = true;
      dropped.swap(items_);
      not_full_.notify_all();
      not_empty_.notify_all();
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable not_full_, not_empty_;
  std::deque<T> items_;
  std::size_t capacity_;
  bool finished_ = false;
  bool cancelled_ = false;
};

}  // namespace loom::data::detail
