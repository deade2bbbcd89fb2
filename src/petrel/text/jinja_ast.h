// The parsed form of a template: expressions (Expr) and statements (Node). Built by jinja_parser,
// walked by jinja_evaluator. Variable names are interned to small integers at parse time so that
// lookups at render time compare integers.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "petrel/text/jinja_value.h"

namespace petrel::jinja {

enum class ExprKind : uint8_t {
  kLiteral,    // literal
  kName,       // name_id
  kList,       // children
  kTuple,      // children
  kDict,       // children: key, value, key, value...
  kGetAttr,    // children[0] . name   (also `x.0`, with literal set to the integer)
  kGetItem,    // children[0] [ children[1] ]
  kSlice,      // children[0] [ start : stop : step ]; absent parts are null children
  kCall,       // children[0] ( args )
  kFilter,     // children[0] | name ( args )
  kTest,       // children[0] is [not] name ( args )
  kNot,        // not children[0]
  kNegate,     // -children[0]
  kPlus,       // +children[0]
  kBinary,     // children[0] op children[1]
  kConcat,     // children joined with ~
  kCompare,    // children[0] ops[0] children[1] ops[1] children[2] ...
  kAnd,        // children[0] and children[1]
  kOr,         // children[0] or children[1]
  kCondition,  // children[1] if children[0] else children[2] (children[2] may be null)
};

enum class BinaryOp : uint8_t { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };
enum class CompareOp : uint8_t { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct CallArguments {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

struct Expr {
  ExprKind kind = ExprKind::kLiteral;
  size_t offset = 0;
  Value literal;                 // kLiteral; kGetAttr with an integer (x.0)
  int name_id = -1;              // kName
  std::string name;              // kName, kGetAttr, kFilter, kTest
  BinaryOp binary_op = BinaryOp::kAdd;
  std::vector<CompareOp> compare_ops;
  bool negated = false;          // kTest: `is not`
  std::vector<ExprPtr> children;
  CallArguments arguments;       // kCall, kFilter, kTest
};

enum class NodeKind : uint8_t {
  kText,         // text
  kOutput,       // {{ expr }}
  kIf,           // conditions[i] -> bodies[i]; else_body
  kFor,          // for targets in expr [if condition]: body, else_body
  kSet,          // set targets = expr  (or set ns.attr = expr)
  kSetBlock,     // set target %}body{% endset
  kMacro,        // macro name(params) body
  kFilterBlock,  // filter name(args) body
  kBody,         // a plain sequence of nodes ({% generation %} blocks render their body as is)
  kBreak,
  kContinue,
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using NodeList = std::vector<NodePtr>;

// An assignment target: a variable, or an attribute of a namespace object.
struct Target {
  int name_id = -1;
  std::string name;
  std::string attribute;  // non-empty for `ns.attr`
};

struct MacroParameter {
  int name_id = -1;
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Node {
  NodeKind kind = NodeKind::kText;
  size_t offset = 0;
  std::string text;                 // kText
  Value text_value;                 // kText, as a string Value to output without copying
  ExprPtr expr;                     // kOutput, kFor (iterable), kSet, kFilterBlock (filter expression)
  ExprPtr condition;                // kFor filter
  std::vector<Target> targets;      // kFor, kSet, kSetBlock (more than one: tuple unpacking)
  std::vector<ExprPtr> conditions;  // kIf
  std::vector<NodeList> bodies;     // kIf: one per condition
  NodeList body;                    // kFor, kSetBlock, kMacro, kFilterBlock, kBody
  NodeList else_body;               // kIf, kFor
  bool has_else = false;
  std::string macro_name;           // kMacro
  int macro_name_id = -1;
  std::vector<MacroParameter> parameters;  // kMacro
};

// A parsed template. Owns its nodes; callables created from macros point into it.
struct Template {
  std::string name;
  std::string source;  // normalized (see normalize_template_source)
  NodeList body;
  std::vector<std::string> symbols;  // name_id -> name
  int loop_symbol = -1;              // the id of `loop`
  int symbol_id(const std::string& symbol) const;
};

}  // namespace petrel::jinja
