// The thread that drives the engine for the server: it steps while any
// request is pending and sleeps on a condition variable otherwise (submit
// and cancel wake it). After every step it snapshots Engine::stats() into
// Metrics, because stats() may only be called from the stepping thread.
// Request callbacks run on this thread. A step that fails (an error, or an
// exception that escaped the engine's own step boundary) fails every
// request the engine holds and marks the loop failed: /health reports it
// and later requests fail at once instead of hanging.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "engine/engine.h"
#include "server/metrics.h"

namespace kvant::server {

class EngineLoop {
 public:
  EngineLoop(Engine& engine, Metrics& metrics);
  ~EngineLoop();
  void start();
  // Wakes the loop after a submit or cancel.
  void wake();
  // Returns once the engine is idle and the thread has ended.
  void stop();
  bool failed() const { return failed_.load(); }
  std::string failure() const;

 private:
  void run();
  void fail(const std::string& error);
  Engine& engine_;
  Metrics& metrics_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool kicked_ = false, stopping_ = false;
  std::atomic<bool> failed_{false};
  std::string failure_;
  std::thread thread_;
};

}  // namespace kvant::server
