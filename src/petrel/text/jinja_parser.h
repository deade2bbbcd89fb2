// Parses template source into a Template (jinja_ast.h) following Jinja2's grammar and operator
// precedence. Unknown filters and tests, unsupported tags ({% include %}, {% extends %}: petrel
// templates do no I/O) and syntax errors are reported with the template name, line and column.
#pragma once

#include <memory>
#include <string>

#include "petrel/text/jinja_ast.h"
#include "petrel/util/status.h"

namespace petrel::jinja {

// `max_nesting_depth` bounds expression and block nesting so that hostile input cannot exhaust the
// stack while parsing or evaluating.
Result<std::shared_ptr<const Template>> parse_template(std::string_view source, std::string name,
                                                       int max_nesting_depth);

}  // namespace petrel::jinja
