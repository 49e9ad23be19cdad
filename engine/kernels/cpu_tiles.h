// How a product's output channels are shared among the threads: the one tile scheduler of the CPU
// kernels (cpu_gemm.cpp's fp32 panels and weight-only kernels, cpu_qdot.cpp's integer kernels).
//
// Threads take tiles from a shared counter rather than a fixed share each: on a shared machine (a
// server's own event loop, a neighbour's job) a thread that loses its core for a while does not hold
// the whole call back; the others take its tiles. Which thread computes a tile never changes its bits.
//
// Tile size: a product of many rows passes over its weights once per block of rows, so a tile is small
// enough to stay in L2 across the blocks (the caller's `many`). A product of one block (a decode step)
// reuses nothing: a thread's weights are best read as few long runs, kShares tiles a thread. Small
// tiles made each thread's stream restart thousands of times a step (64-channel tiles: ~3,200 an
// int4w8a+head8 step), each restart with cold misses; two tiles a thread ran that step in 0.79x the
// time (2 threads, AMD EPYC Zen 4, context 256; one tile a thread 0.77x, but then a thread that loses
// its core holds the step back): `python -m engine.bench bandwidth` shows it,
// docs/quantization-w8a-2026-12-05.md.
#pragma once
#include <ATen/Parallel.h>

#include <c10/util/FunctionRef.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>

namespace tiles {

constexpr int64_t kShares = 2;  // one row block: tiles a thread

// Units (output channels, or panels of them) a tile: `many` where the rows come in several blocks, else
// kShares tiles a thread, at least `least` units.
inline int64_t size(int64_t units, bool one_block, int64_t many, int64_t least) {
  if (!one_block) return many;
  const int64_t parts = kShares * at::get_num_threads();
  return std::max(least, (units + parts - 1) / parts);
}

// tile(t) for every t in [0, count) a shared counter `next` hands out: what each thread of a parallel call
// runs, whichever thread it is (tiles::run below, and Team's leader and helpers in cpu_tiles.cpp).
template <typename Tile>
inline void take(std::atomic<int64_t>& next, int64_t count, Tile&& tile) {
  for (int64_t t = next.fetch_add(1); t < count; t = next.fetch_add(1)) tile(t);
}

// One OpenMP team held for a whole call (cpu_layers.cpp: a decode step's layer loop), so that its many
// small parallel calls do not each open and close a parallel region (0.67 us a region, 2 threads, AMD EPYC
// Zen 4: ~0.1 ms of an int4w8a+head8 step's 151; docs/quantization-w8a-2026-12-05.md). The caller's thread
// leads: it runs `body` alone, and every run() it makes there (tiles::run below) is served by the team's
// other threads, which wait spinning between calls, as OpenMP's own do between regions. Which thread
// computes a tile still never changes its bits.
class Team {
 public:
  // body() on the calling thread with `threads` (at most; fewer where OpenMP gives fewer) serving its
  // run() calls; an exception body throws is rethrown here after the team has stopped.
  static void lead(int threads, c10::function_ref<void()> body);
  static Team* current();  // the team the calling thread leads, or null
  void run(int64_t count, c10::function_ref<void(int64_t)> tile);

 private:
  static constexpr uint64_t kStop = ~uint64_t{0};
  void serve();
  alignas(64) std::atomic<uint64_t> posted_{0};  // the latest call's number; kStop: the body returned
  alignas(64) std::atomic<int64_t> next_{0};     // the current call's next tile
  alignas(64) std::atomic<int> done_{0};         // helpers finished with the current call
  c10::function_ref<void(int64_t)>* tile_ = nullptr;
  int64_t count_ = 0;
  uint64_t calls_ = 0;
  int helpers_ = 0;
};

// tile(t) for t in [0, count), each exactly once, by whichever thread takes it.
template <typename Tile>
void run(int64_t count, Tile&& tile) {
  if (Team* team = Team::current()) return team->run(count, tile);
  alignas(64) std::atomic<int64_t> next{0};  // its own cache line: the caller's stack beside it is written
  at::parallel_for(0, std::min<int64_t>(count, at::get_num_threads()), 1,
                   [&](int64_t, int64_t) { take(next, count, tile); });
}

}  // namespace tiles
