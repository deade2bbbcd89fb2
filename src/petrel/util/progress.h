// A progress line for long work: "\r quantize [#####     ] 52%  layer 17/32 gptq mlp.down_proj  2m10s, ETA 1m58s"
// redrawn in place on a terminal, or a plain line every 10% when stderr is not one.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace petrel {

class ProgressBar {
 public:
  ProgressBar(std::string label, double total, bool enabled = true);
  // Reports `done` of `total` units, with a short note of the current step.
  void update(double done, const std::string& note = "");
  // Prints the final line ("done in 1m02s").
  void finish(const std::string& note = "");

 private:
  std::string label_;
  double total_;
  bool enabled_;
  bool tty_;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

std::string format_duration(double seconds);

}  // namespace petrel
