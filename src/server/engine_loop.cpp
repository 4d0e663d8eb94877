// Engine loop thread (see engine_loop.h).
#include "server/engine_loop.h"

#include <cstdio>

namespace kvant::server {

EngineLoop::EngineLoop(Engine& engine, Metrics& metrics) : engine_(engine), metrics_(metrics) {}

EngineLoop::~EngineLoop() { stop(); }

void EngineLoop::start() {
  metrics_.set_engine(engine_.stats());
  thread_ = std::thread([this] { run(); });
}

void EngineLoop::wake() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    kicked_ = true;
  }
  cv_.notify_one();
}

void EngineLoop::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

std::string EngineLoop::failure() const { return failed_.load() ? failure_ : std::string(); }

void EngineLoop::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      // A submit makes the engine non-idle before wake() is called, so the
      // predicate also catches work that arrived before this wait began.
      cv_.wait(lk, [&] { return stopping_ || kicked_ || !engine_.idle(); });
      if (stopping_ && engine_.idle()) break;
      kicked_ = false;
    }
    // Cancels of already finished requests leave the engine idle; one step
    // still drains them.
    do {
      auto r = engine_.step();
      if (!r) {
        failure_ = r.error().message;
        failed_.store(true);
        std::fprintf(stderr, "kvant serve: engine failure: %s\n", failure_.c_str());
        metrics_.set_engine(engine_.stats());
        return;
      }
      metrics_.set_engine(engine_.stats());
    } while (!engine_.idle());
  }
}

}  // namespace kvant::server
