// What tests (and only tests) reach inside an Engine: its page pool and
// scheduler, to inject faults and check that every page came back, and the
// scheduler sequence serving a request. engine.h keeps these out of the
// API the server, the CLI and eval use.
#pragma once

#include "engine/engine.h"
#include "engine/scheduler.h"
#include "kvcache/page_pool.h"

namespace kvant {

struct EngineTesting {
  static PagePool& pool(Engine& e) { return *e.pool_; }
  static Scheduler& scheduler(Engine& e) { return *e.scheduler_; }
  static uint64_t sequence_of(const Engine& e, RequestId id) { return e.sequence_of(id); }
};

}  // namespace kvant
