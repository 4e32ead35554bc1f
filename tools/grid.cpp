#include "grid.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace normjit::tools {

std::string GridGroup::spec(std::int64_t M) const { return fmt::format("{}{}x{}{}", spec_head, M, N, options); }

std::size_t Grid::entries() const {
  std::size_t n = 0;
  for (const auto& g : groups) n += g.Ms.size();
  return n;
}

namespace {
// Indices 0..n-1 coarse first: 0, n-1, then midpoints of ever finer halves.
std::vector<std::size_t> coarse_first(std::size_t n) {
  std::vector<std::size_t> order;
  std::vector<bool> seen(n, false);
  auto add = [&](std::size_t i) {
    if (i < n && !seen[i]) {
      seen[i] = true;
      order.push_back(i);
    }
  };
  if (n == 0) return order;
  add(0);
  add(n - 1);
  for (std::size_t step = n; step > 1; step = (step + 1) / 2)
    for (std::size_t i = 0; i < n; i += step) add(i + step / 2);
  for (std::size_t i = 0; i < n; ++i) add(i);
  return order;
}
}  // namespace

Grid read_grid(const std::string& path) {
  auto bad = [&](const std::string& what) {
    return Error(ErrorKind::InvalidArgument, fmt::format("--grid '{}': {}", path, what));
  };
  std::ifstream in(path);
  if (!in) throw bad("cannot be opened");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
    Grid g;
    std::set<std::int64_t> ns;
    const auto& lg = j.at("N_log");
    const double lo = lg.at("min").get<double>(), hi = lg.at("max").get<double>();
    const int count = lg.at("count").get<int>();
    const std::int64_t mult = lg.at("multiple").get<std::int64_t>();
    if (!(lo >= 1 && hi >= lo && count >= 2 && mult >= 1)) throw bad("N_log needs 1 <= min <= max, count >= 2, multiple >= 1");
    for (int i = 0; i < count; ++i) {
      const double v = lo * std::pow(hi / lo, double(i) / (count - 1));
      ns.insert(std::max<std::int64_t>(mult, std::llround(v / mult) * mult));
    }
    if (j.contains("N_odd")) {
      const auto& od = j.at("N_odd");
      const double olo = od.at("min").get<double>(), ohi = od.at("max").get<double>();
      const int oc = od.at("count").get<int>();
      if (!(olo >= 1 && ohi >= olo && oc >= 2)) throw bad("N_odd needs 1 <= min <= max, count >= 2");
      for (int i = 0; i < oc; ++i) {
        const std::int64_t v = std::llround(olo * std::pow(ohi / olo, double(i) / (oc - 1)));
        ns.insert(v % 2 ? v : v + (v + 1 <= 262144 ? 1 : -1));
      }
    }
    for (const auto& [family, sizes] : j.at("N_models").items())
      for (const auto& n : sizes) ns.insert(n.get<std::int64_t>());
    g.N.assign(ns.begin(), ns.end());
    for (std::int64_t n : g.N)
      if (n < 1 || n > 262144) throw bad(fmt::format("N = {} is outside [1, 262144]", n));
    const std::int64_t max_el = j.at("max_elements").get<std::int64_t>();
    std::vector<std::int64_t> ms = j.at("M").get<std::vector<std::int64_t>>();
    std::sort(ms.begin(), ms.end());
    if (ms.empty() || ms.front() < 1) throw bad("M must list values >= 1");
    struct V {
      std::string norm, options;
      std::vector<std::string> ops;
    };
    std::vector<V> variants;
    for (const auto& v : j.at("variants"))
      variants.push_back({v.at("norm").get<std::string>(), v.at("options").get<std::string>(),
                          v.at("ops").get<std::vector<std::string>>()});
    for (const auto& dt : j.at("dtypes").get<std::vector<std::string>>())
      for (std::size_t i : coarse_first(g.N.size())) {
        const std::int64_t n = g.N[i];
        std::vector<std::int64_t> m_of_n;
        for (std::int64_t m : ms) {
          if (m * n <= max_el) {
            m_of_n.push_back(m);
          } else {
            std::int64_t p = 1;
            while (p * 2 * n <= max_el) p *= 2;
            if (m_of_n.empty() || m_of_n.back() < p) m_of_n.push_back(p);
            break;
          }
        }
        for (const auto& v : variants)
          for (const auto& op : v.ops) {
            if (op != "fwd" && op != "bwd") throw bad(fmt::format("op '{}' is not fwd or bwd", op));
            g.groups.push_back({op == "fwd" ? Op::Forward : Op::Backward, fmt::format("{}:{}:", v.norm, dt), v.options,
                                n, m_of_n});
          }
      }
    return g;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw bad(e.what());
  }
}

}  // namespace normjit::tools
