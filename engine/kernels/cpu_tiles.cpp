// The held OpenMP team of cpu_tiles.h (Team): the calling thread leads, the others serve its run() calls.
#include "cpu_tiles.h"

#include <ATen/ops/tensor.h>
#include <immintrin.h>
#include <omp.h>
#include <torch/library.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

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
      team.serve(omp_get_thread_num());
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
  runs_.init(count, helpers_ + 1);
  done_.store(0, std::memory_order_relaxed);
  posted_.store(++calls_, std::memory_order_release);  // the helpers start
  runs_.take(0, tile);
  while (done_.load(std::memory_order_acquire) < helpers_) _mm_pause();
}

void Team::serve(int thread) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t posted;
    for (int64_t spins = 0; (posted = posted_.load(std::memory_order_acquire)) == seen; ++spins) {
      _mm_pause();
      if (spins > (1 << 16)) std::this_thread::yield();  // a long serial stretch: let others have the core
    }
    if (posted == kStop) return;
    seen = posted;
    runs_.take(thread, *tile_);
    done_.fetch_add(1, std::memory_order_release);
  }
}

namespace {

// The tests' view of the scheduler (tests/test_cpu_tiles.py): `count` tiles through tiles::run, in a held
// team (`team`) or a plain parallel call, with torch's threads; the tiles listed in `slow` spin `spin_ms` each.
// Returns [2, count]: how many times each tile ran, and the OpenMP thread that ran it.
at::Tensor census(int64_t count, bool team, at::IntArrayRef slow, int64_t spin_ms) {
  TORCH_CHECK(count >= 0 && count < (int64_t{1} << 31), "tiles_census: count in [0, 2^31)");
  std::unique_ptr<std::atomic<int64_t>[]> times(new std::atomic<int64_t>[count]());
  std::vector<int64_t> who(count, -1);
  std::vector<char> spin(count, 0);
  for (int64_t t : slow) {
    TORCH_CHECK(t >= 0 && t < count, "tiles_census: slow tile ", t, " out of range");
    spin[t] = 1;
  }
  auto tile = [&](int64_t t) {
    times[t].fetch_add(1);
    who[t] = omp_get_thread_num();
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(spin[t] ? spin_ms : 0);
    while (std::chrono::steady_clock::now() < end) _mm_pause();
  };
  if (team)
    Team::lead(at::get_num_threads(), [&] { run(count, tile); });
  else
    run(count, tile);
  std::vector<int64_t> out(2 * count);  // [times; who]
  for (int64_t t = 0; t < count; ++t) out[t] = times[t].load(), out[count + t] = who[t];
  return at::tensor(out).view({2, count});
}

}  // namespace
}  // namespace tiles

TORCH_LIBRARY_FRAGMENT(latency_lab_gemv, m) {
  m.def("tiles_census(int count, bool team, int[] slow, int spin_ms) -> Tensor", &tiles::census);
}
