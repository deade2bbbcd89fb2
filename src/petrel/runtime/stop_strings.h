// Stop strings over streamed text: text that may still grow into a stop string is held back until it cannot,
// so a stop string is never shown, even when it arrives split across tokens.
#pragma once

#include <string>
#include <vector>

namespace petrel {

class StopStringFilter {
 public:
  explicit StopStringFilter(std::vector<std::string> stops);
  // Returns the text that is safe to emit; sets *stopped when a stop string completed (it and anything after
  // it are dropped).
  std::string push(const std::string& piece, bool* stopped);
  // The held-back text, at the end of generation.
  std::string flush();

 private:
  std::vector<std::string> stops_;
  std::string pending_;
};

}  // namespace petrel
