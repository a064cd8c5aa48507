// One execution thread per device: programs run in the order they were queued, so a program
// always finds its inputs computed. Work queued from the device thread itself (a step
// closure that reads a pending tensor) runs inline instead of deadlocking.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace loom::runtime {

class DeviceQueue {
 public:
  DeviceQueue();
  ~DeviceQueue();

  void enqueue(std::function<void()> task);
  void wait_idle();
  bool on_device_thread() const;

 private:
  void loop();

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<std::function<void()>> tasks_;
  int running_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace loom::runtime
