#include "petrel/runtime/profile.h"

#include <chrono>

namespace petrel {

using ojson = nlohmann::ordered_json;

int64_t wall_clock_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {
ojson metric(double value, const char* unit) { return {{"value", value}, {"unit", unit}}; }
ojson metric(int64_t value, const char* unit) { return {{"value", value}, {"unit", unit}}; }
}  // namespace

ojson genie_profile_json(const DialogCreateEvent& create, const std::vector<DialogQueryEvent>& queries) {
  ojson events = ojson::array();
  events.push_back({{"type", "GenieDialog_create"},
                    {"duration", create.stop_us - create.start_us},
                    {"start", create.start_us},
                    {"stop", create.stop_us},
                    {"init-time", metric(create.stop_us - create.start_us, "us")}});
  for (const DialogQueryEvent& q : queries) {
    const double ttft_s = q.time_to_first_token_us / 1e6;
    const double gen_s = q.token_generation_time_us / 1e6;
    events.push_back({{"type", "GenieDialog_query"},
                      {"duration", q.stop_us - q.start_us},
                      {"start", q.start_us},
                      {"stop", q.stop_us},
                      {"num-prompt-tokens", metric(q.prompt_tokens, "")},
                      {"prompt-processing-rate", metric(ttft_s > 0 ? q.prompt_tokens / ttft_s : 0.0, "toks/sec")},
                      {"time-to-first-token", metric(q.time_to_first_token_us, "us")},
                      {"num-generated-tokens", metric(q.generated_tokens, "")},
                      {"token-generation-rate", metric(gen_s > 0 ? q.generated_tokens / gen_s : 0.0, "toks/sec")},
                      {"token-generation-time", metric(q.token_generation_time_us, "us")}});
  }
  ojson profile;
  profile["header"] = {{"header_version", {{"major", 0}, {"minor", 1}, {"patch", 0}}},
                       {"version", {{"major", 0}, {"minor", 1}, {"patch", 0}}},
                       {"artifact_type", "GENIE_PROFILE"}};
  profile["metadata"] = {{"timestamp", wall_clock_us()}, {"producer", std::string("petrel ") + PETREL_VERSION}};
  profile["components"] = ojson::array({{{"name", "dialog0"}, {"type", "dialog"}, {"events", events}}});
  return profile;
}

}  // namespace petrel
