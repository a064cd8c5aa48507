#include "runtime/device_queue.h"

#include <loom/profiler.h>

namespace loom::runtime {

DeviceQueue::DeviceQueue() : thread_([this] { loop(); }) {}

DeviceQueue::~DeviceQueue() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void DeviceQueue::enqueue(std::function<void()> task) {
  if (on_device_thread()) {
    task();
    return;
  }
  {
    std::lock_guard lock(mutex_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
}

void DeviceQueue::loop() {
  profiler::set_thread_name("device");
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return !tasks_.empty() || stop_; });
    if (tasks_.empty() && stop_) return;
    if (tasks_.empty()) continue;
    auto task = std::move(tasks_.front());
    tasks_.pop_front();
    ++running_;
    lock.unlock();
    task();  // tasks catch their own errors
    lock.lock();
    --running_;
    if (tasks_.empty() && running_ == 0) idle_cv_.notify_all();
  }
}

void DeviceQueue::wait_idle() {
  if (on_device_thread()) return;
  std::unique_lock lock(mutex_);
  idle_cv_.wait(lock, [&] { return tasks_.empty() && running_ == 0; });
}

bool DeviceQueue::on_device_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

}  // namespace loom::runtime
