#include "petrel/runtime/stop_strings.h"

#include <algorithm>
#include <utility>

namespace petrel {

StopStringFilter::StopStringFilter(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopStringFilter::push(const std::string& piece, bool* stopped) {
  pending_ += piece;
  size_t first_stop = std::string::npos;
  for (const std::string& stop : stops_) first_stop = std::min(first_stop, pending_.find(stop));
  if (first_stop != std::string::npos) {
    *stopped = true;
    std::string out = pending_.substr(0, first_stop);
    pending_.clear();
    return out;
  }
  size_t hold = 0;  // the longest suffix of pending_ that is a proper prefix of a stop string
  for (const std::string& stop : stops_) {
    for (size_t n = std::min(stop.size() - 1, pending_.size()); n > hold; --n) {
      if (pending_.compare(pending_.size() - n, n, stop, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStringFilter::flush() { return std::exchange(pending_, std::string()); }

}  // namespace petrel
