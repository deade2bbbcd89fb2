// Renders a parsed Template: walks the tree with Jinja2's scoping rules (a for-loop body gets a fresh
// scope on every iteration; {% set %} inside {% if %} writes to the enclosing scope; macros see their
// arguments and the template's top-level variables) under hard limits on work, output and recursion.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

#include "petrel/text/jinja_ast.h"
#include "petrel/text/jinja_value.h"
#include "petrel/util/status.h"

namespace petrel::jinja {

struct RenderSettings {
  size_t max_output_bytes = 8u << 20;      // also bounds every intermediate string
  uint64_t max_steps = 20'000'000;         // expression evaluations and statements executed
  uint64_t max_loop_iterations = 1'000'000;  // all for-loop iterations of the render together
  int max_call_depth = 100;                // nested macro calls
  int max_nesting_depth = 256;             // nesting of containers built by the template
  std::tm now{};                           // what strftime_now() formats
};

// Renders `tpl` with `variables` bound at the top level (on top of the global functions range,
// namespace, dict, raise_exception and strftime_now). Errors carry the template name, line and column:
// kInvalidArgument for errors the template reports or Python would raise, kOutOfRange for limits.
Result<TString> render_template(const Template& tpl, const std::vector<std::pair<std::string, Value>>& variables,
                                const RenderSettings& settings);

}  // namespace petrel::jinja
