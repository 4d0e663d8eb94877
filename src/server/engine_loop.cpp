// Engine loop thread (see engine_loop.h).
#include "server/engine_loop.h"

#include <chrono>

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

std::string EngineLoop::failure() const {
  std::lock_guard<std::mutex> lk(mu_);
  return failure_;
}

// The engine could not step: every request it holds fails with the message
// (their clients get an error, not a hang), the failure is kept for /health,
// and from now on the loop only fails what is still submitted.
void EngineLoop::fail(const std::string& error) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    failure_ = error;
  }
  failed_.store(true);
  std::fprintf(stderr, "kvant serve: engine failure: %s\n", error.c_str());
  try {
    engine_.fail_all("the engine failed; the server no longer serves requests");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvant serve: failing the requests also failed: %s\n", e.what());
  }
  metrics_.set_engine(engine_.stats());
}

void EngineLoop::run() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      // A submit makes the engine non-idle before wake() is called, so the
      // predicate also catches work that arrived before this wait began.
      auto ready = [&] { return stopping_ || kicked_ || !engine_.idle(); };
      if (engine_.ranks() > 1) {
        // The other ranks wait in rank 0's next step: an idle rank 0 still
        // steps twice a second, so that their timeout tells a dead rank 0
        // from a quiet one.
        cv_.wait_for(lk, std::chrono::milliseconds(500), ready);
      } else {
        cv_.wait(lk, ready);
      }
      if (stopping_ && engine_.idle()) break;
      kicked_ = false;
    }
    if (failed_.load()) {
      // Requests that raced in are failed rather than run.
      try {
        engine_.fail_all("the engine failed; the server no longer serves requests");
      } catch (...) {
      }
      continue;
    }
    // Cancels of already finished requests leave the engine idle; one step
    // still drains them.
    do {
      std::string error;
      try {
        auto r = engine_.step();
        if (!r) error = r.error().message;
      } catch (const std::exception& e) {
        error = std::string("exception: ") + e.what();
      }
      if (!error.empty()) {
        fail(error);
        break;
      }
      metrics_.set_engine(engine_.stats());
    } while (!engine_.idle());
  }
}

}  // namespace kvant::server
