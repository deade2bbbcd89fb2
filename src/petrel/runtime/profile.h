// Qualcomm Genie's profile JSON (what `genie-t2t-run --profile FILE` writes), from petrel's timings.
// Semantics reproduced from Genie: time-to-first-token covers prompt processing and sampling the first token;
// prompt-processing-rate = prompt tokens / TTFT; token-generation-time covers the tokens after the first, yet
// num-generated-tokens counts the first too and token-generation-rate divides that count by that time.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

namespace petrel {

struct DialogCreateEvent {
  int64_t start_us = 0, stop_us = 0;  // wall clock, microseconds since the epoch
};

struct DialogQueryEvent {
  int64_t start_us = 0, stop_us = 0;
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;          // the first token included
  double time_to_first_token_us = 0;     // prefill + first sample
  double token_generation_time_us = 0;   // the tokens after the first
};

nlohmann::ordered_json genie_profile_json(const DialogCreateEvent& create, const std::vector<DialogQueryEvent>& queries);

// Microseconds since the epoch, for event timestamps.
int64_t wall_clock_us();

}  // namespace petrel
