// Python's arithmetic, comparison and membership operators on template values, including the
// TypeErrors Python raises (so a template that fails under Jinja2 fails under petrel too).
#pragma once

#include "petrel/text/jinja_ast.h"
#include "petrel/text/jinja_builtins.h"
#include "petrel/text/jinja_value.h"
#include "petrel/util/status.h"

namespace petrel::jinja {

Result<Value> unary_operator(bool negate, const Value& v);
Result<Value> binary_operator(BuiltinContext& ctx, BinaryOp op, const Value& a, const Value& b);
Result<bool> compare_operator(CompareOp op, const Value& a, const Value& b);
// Python `item in container`.
Result<bool> contains(const Value& container, const Value& item);
// Python's printf-style `format % args` for %s %r %d %i %f %x %% (what templates use).
Result<Value> percent_format(const TString& format, const Value& args);

}  // namespace petrel::jinja
