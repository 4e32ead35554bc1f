#include "core/parallel.hpp"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace normjit::detail {

void parallel_for(int n, const std::function<void(int)>& fn) {
  const int workers = std::max(1, std::min<int>(n, static_cast<int>(std::thread::hardware_concurrency())));
  std::atomic<int> next{0};
  std::exception_ptr first;
  std::mutex mu;
  std::vector<std::thread> pool;
  for (int t = 0; t < workers; ++t)
    pool.emplace_back([&] {
      for (int i; (i = next++) < n;) {
        try {
          fn(i);
        } catch (...) {
          std::lock_guard<std::mutex> lk(mu);
          if (!first) first = std::current_exception();
        }
      }
    });
  for (auto& th : pool) th.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace normjit::detail
