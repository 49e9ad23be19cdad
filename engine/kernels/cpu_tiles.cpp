// The held OpenMP team of cpu_tiles.h (Team): the calling thread leads, the others serve its run() calls.
#include "cpu_tiles.h"

#include <immintrin.h>
#include <omp.h>

#include <thread>

namespace tiles {
namespace {
thread_local Team* led = nullptr;  // the team this thread leads
}  // namespace

Team* Team::current() { return led; }

void Team::lead(int threads, c10::function_ref<void()> body) {
  Team team;
  std::exception_ptr error;
#pragma omp parallel num_threads(threads)
  {
    if (omp_get_thread_num() == 0) {
      team.helpers_ = omp_get_num_threads() - 1;
      led = &team;
      try {
        body();
      } catch (...) {
        error = std::current_exception();
      }
      led = nullptr;
      team.posted_.store(kStop, std::memory_order_release);
    } else {
      team.serve();
    }
  }
  if (error) std::rethrow_exception(error);
}

void Team::run(int64_t count, c10::function_ref<void(int64_t)> tile) {
  if (helpers_ == 0) {
    for (int64_t t = 0; t < count; ++t) tile(t);
    return;
  }
  tile_ = &tile;
  count_ = count;
  next_.store(0, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  posted_.store(++calls_, std::memory_order_release);  // the helpers start
  take(next_, count, tile);
  while (done_.load(std::memory_order_acquire) < helpers_) _mm_pause();
}

void Team::serve() {
  uint64_t seen = 0;
  for (;;) {
    uint64_t posted;
    for (int64_t spins = 0; (posted = posted_.load(std::memory_order_acquire)) == seen; ++spins) {
      _mm_pause();
      if (spins > (1 << 16)) std::this_thread::yield();  // a long serial stretch: let others have the core
    }
    if (posted == kStop) return;
    seen = posted;
    take(next_, count_, *tile_);
    done_.fetch_add(1, std::memory_order_release);
  }
}

}  // namespace tiles
