#include "petrel/text/jinja_parser.h"

#include <initializer_list>
#include <unordered_map>

#include "petrel/text/jinja_builtins.h"
#include "petrel/text/jinja_lexer.h"

namespace petrel::jinja {

int Template::symbol_id(const std::string& symbol) const {
  for (size_t i = 0; i < symbols.size(); ++i) {
    if (symbols[i] == symbol) return static_cast<int>(i);
  }
  return -1;
}

namespace {

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, Template& tpl, int max_depth)
      : tokens_(tokens), tpl_(tpl), max_depth_(max_depth) {}

  Status parse() {
    tpl_.loop_symbol = intern("loop");
    PETREL_ASSIGN_OR_RETURN(tpl_.body, parse_body({}, ""));
    return ok_status();
  }

 private:
  // ------------------------------------------------------------ token helpers

  const Token& peek(size_t ahead = 0) const {
    size_t i = pos_ + ahead;
    return i < tokens_.size() ? tokens_[i] : tokens_.back();
  }
  const Token& next() {
    const Token& t = peek();
    if (pos_ < tokens_.size() - 1) ++pos_;
    return t;
  }
  bool at_operator(std::string_view op, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::kOperator && peek(ahead).text == op;
  }
  bool at_name(std::string_view name, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::kName && peek(ahead).text == name;
  }
  bool skip_operator(std::string_view op) {
    if (!at_operator(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!at_name(name)) return false;
    next();
    return true;
  }

  Status error_at(const Token& t, std::string_view message) const {
    return invalid_data(located_message(tpl_.name, tpl_.source, t.offset, message));
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case TokenKind::kData: return "template data";
      case TokenKind::kVariableBegin: return "'{{'";
      case TokenKind::kVariableEnd: return "end of print statement";
      case TokenKind::kBlockBegin: return "'{%'";
      case TokenKind::kBlockEnd: return "end of statement block";
      case TokenKind::kName: return "'" + t.text + "'";
      case TokenKind::kString: return "string";
      case TokenKind::kInteger: return "integer";
      case TokenKind::kFloat: return "float";
      case TokenKind::kOperator: return "'" + t.text + "'";
      case TokenKind::kEnd: return "end of template";
    }
    return "token";
  }
  Status unexpected(std::string_view expected) const {
    return error_at(peek(), "expected " + std::string(expected) + ", got " + describe(peek()));
  }
  Status expect_operator(std::string_view op) {
    if (skip_operator(op)) return ok_status();
    return unexpected("'" + std::string(op) + "'");
  }
  Status expect_block_end() {
    if (peek().kind == TokenKind::kBlockEnd) {
      next();
      return ok_status();
    }
    return unexpected("end of statement block");
  }
  Result<std::string> expect_name() {
    if (peek().kind != TokenKind::kName) return unexpected("a name");
    return next().text;
  }

  int intern(const std::string& name) {
    auto it = symbol_ids_.find(name);
    if (it != symbol_ids_.end()) return it->second;
    int id = static_cast<int>(tpl_.symbols.size());
    tpl_.symbols.push_back(name);
    symbol_ids_.emplace(name, id);
    return id;
  }

  // Bounds recursion in the parser (and so in the evaluator, which walks the same tree).
  class DepthGuard {
   public:
    explicit DepthGuard(Parser& p) : p_(p) { ++p_.depth_; }
    ~DepthGuard() { --p_.depth_; }
    Status check() const {
      if (p_.depth_ > p_.max_depth_) {
        return p_.error_at(p_.peek(), "template nested too deeply (more than " + std::to_string(p_.max_depth_) +
                                          " levels)");
      }
      return ok_status();
    }

   private:
    Parser& p_;
  };

  ExprPtr make_expr(ExprKind kind, size_t offset) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->offset = offset;
    return e;
  }

  // ------------------------------------------------------------ statements

  // Parses nodes until a block tag named in `end_tags` (left unconsumed, positioned at its name) or the
  // end of the template when end_tags is empty.
  Result<NodeList> parse_body(std::initializer_list<std::string_view> end_tags, std::string_view opener) {
    DepthGuard guard(*this);
    PETREL_RETURN_IF_ERROR(guard.check());
    NodeList body;
    while (true) {
      const Token& t = peek();
      if (t.kind == TokenKind::kEnd) {
        if (end_tags.size() == 0) return body;
        std::string wanted;
        for (std::string_view tag : end_tags) wanted += (wanted.empty() ? "'" : " or '") + std::string(tag) + "'";
        return error_at(t, "unexpected end of template; looking for " + wanted + " to close '" +
                               std::string(opener) + "'");
      }
      if (t.kind == TokenKind::kData) {
        auto node = std::make_unique<Node>();
        node->kind = NodeKind::kText;
        node->offset = t.offset;
        node->text = t.text;
        node->text_value = Value::string(t.text);
        body.push_back(std::move(node));
        next();
        continue;
      }
      if (t.kind == TokenKind::kVariableBegin) {
        next();
        auto node = std::make_unique<Node>();
        node->kind = NodeKind::kOutput;
        node->offset = t.offset;
        PETREL_ASSIGN_OR_RETURN(node->expr, parse_tuple(true, false));
        if (peek().kind != TokenKind::kVariableEnd) return unexpected("end of print statement");
        next();
        body.push_back(std::move(node));
        continue;
      }
      if (t.kind == TokenKind::kBlockBegin) {
        const Token& tag = peek(1);
        if (tag.kind == TokenKind::kName) {
          for (std::string_view end_tag : end_tags) {
            if (tag.text == end_tag) {
              next();  // leave the tag name for the caller
              return body;
            }
          }
        }
        next();
        PETREL_ASSIGN_OR_RETURN(NodePtr node, parse_statement());
        if (node) body.push_back(std::move(node));
        continue;
      }
      return error_at(t, "unexpected " + describe(t));
    }
  }

  Result<NodePtr> parse_statement() {
    const Token& tag = peek();
    if (tag.kind != TokenKind::kName) return error_at(tag, "tag name expected");
    const std::string name = tag.text;
    size_t offset = tag.offset;
    next();
    if (name == "if") return parse_if(offset);
    if (name == "for") return parse_for(offset);
    if (name == "set") return parse_set(offset);
    if (name == "macro") return parse_macro(offset);
    if (name == "filter") return parse_filter_block(offset);
    if (name == "generation") {  // transformers' AssistantTracker extension; rendering ignores it
      PETREL_RETURN_IF_ERROR(expect_block_end());
      auto node = std::make_unique<Node>();
      node->kind = NodeKind::kBody;
      node->offset = offset;
      PETREL_ASSIGN_OR_RETURN(node->body, parse_body({"endgeneration"}, "generation"));
      next();
      PETREL_RETURN_IF_ERROR(expect_block_end());
      return node;
    }
    if (name == "break" || name == "continue") {
      PETREL_RETURN_IF_ERROR(expect_block_end());
      auto node = std::make_unique<Node>();
      node->kind = name == "break" ? NodeKind::kBreak : NodeKind::kContinue;
      node->offset = offset;
      return node;
    }
    if (name == "include" || name == "import" || name == "from" || name == "extends") {
      return error_at(tag, "'" + name + "' is not supported: petrel templates cannot load other templates");
    }
    if (name == "call" || name == "block" || name == "with" || name == "autoescape" || name == "do" ||
        name == "trans") {
      return error_at(tag, "the '" + name + "' tag is not supported by petrel's Jinja subset");
    }
    return error_at(tag, "encountered unknown tag '" + name + "'");
  }

  Result<NodePtr> parse_if(size_t offset) {
    auto node = std::make_unique<Node>();
    node->kind = NodeKind::kIf;
    node->offset = offset;
    while (true) {
      PETREL_ASSIGN_OR_RETURN(ExprPtr condition, parse_tuple(false, false));
      PETREL_RETURN_IF_ERROR(expect_block_end());
      PETREL_ASSIGN_OR_RETURN(NodeList body, parse_body({"elif", "else", "endif"}, "if"));
      node->conditions.push_back(std::move(condition));
      node->bodies.push_back(std::move(body));
      std::string tag = next().text;
      if (tag == "elif") continue;
      if (tag == "else") {
        PETREL_RETURN_IF_ERROR(expect_block_end());
        PETREL_ASSIGN_OR_RETURN(node->else_body, parse_body({"endif"}, "if"));
        node->has_else = true;
        next();
      }
      PETREL_RETURN_IF_ERROR(expect_block_end());
      return node;
    }
  }

  Result<std::vector<Target>> parse_targets(bool allow_namespace_attribute) {
    std::vector<Target> targets;
    bool parenthesized = skip_operator("(");
    while (true) {
      Target target;
      PETREL_ASSIGN_OR_RETURN(target.name, expect_name());
      target.name_id = intern(target.name);
      if (allow_namespace_attribute && at_operator(".")) {
        next();
        PETREL_ASSIGN_OR_RETURN(target.attribute, expect_name());
      }
      targets.push_back(std::move(target));
      if (!skip_operator(",")) break;
      if (!parenthesized && (at_name("in") || at_operator("="))) break;
    }
    if (parenthesized) PETREL_RETURN_IF_ERROR(expect_operator(")"));
    return targets;
  }

  Result<NodePtr> parse_for(size_t offset) {
    auto node = std::make_unique<Node>();
    node->kind = NodeKind::kFor;
    node->offset = offset;
    PETREL_ASSIGN_OR_RETURN(node->targets, parse_targets(false));
    if (!skip_name("in")) return unexpected("'in'");
    PETREL_ASSIGN_OR_RETURN(node->expr, parse_tuple(false, false, /*stop_at_if=*/true));
    if (skip_name("if")) {
      PETREL_ASSIGN_OR_RETURN(node->condition, parse_expression(true));
    }
    if (at_name("recursive")) return error_at(peek(), "recursive for loops are not supported by petrel");
    PETREL_RETURN_IF_ERROR(expect_block_end());
    PETREL_ASSIGN_OR_RETURN(node->body, parse_body({"endfor", "else"}, "for"));
    if (next().text == "else") {
      PETREL_RETURN_IF_ERROR(expect_block_end());
      PETREL_ASSIGN_OR_RETURN(node->else_body, parse_body({"endfor"}, "for"));
      node->has_else = true;
      next();
    }
    PETREL_RETURN_IF_ERROR(expect_block_end());
    return node;
  }

  Result<NodePtr> parse_set(size_t offset) {
    auto node = std::make_unique<Node>();
    node->offset = offset;
    PETREL_ASSIGN_OR_RETURN(node->targets, parse_targets(true));
    if (skip_operator("=")) {
      node->kind = NodeKind::kSet;
      PETREL_ASSIGN_OR_RETURN(node->expr, parse_tuple(true, false));
      PETREL_RETURN_IF_ERROR(expect_block_end());
      return node;
    }
    if (node->targets.size() != 1) return unexpected("'='");
    node->kind = NodeKind::kSetBlock;
    if (at_operator("|")) return error_at(peek(), "filtered block set is not supported by petrel");
    PETREL_RETURN_IF_ERROR(expect_block_end());
    PETREL_ASSIGN_OR_RETURN(node->body, parse_body({"endset"}, "set"));
    next();
    PETREL_RETURN_IF_ERROR(expect_block_end());
    return node;
  }

  Result<NodePtr> parse_macro(size_t offset) {
    auto node = std::make_unique<Node>();
    node->kind = NodeKind::kMacro;
    node->offset = offset;
    PETREL_ASSIGN_OR_RETURN(node->macro_name, expect_name());
    node->macro_name_id = intern(node->macro_name);
    PETREL_RETURN_IF_ERROR(expect_operator("("));
    while (!at_operator(")")) {
      if (!node->parameters.empty()) PETREL_RETURN_IF_ERROR(expect_operator(","));
      if (at_operator(")")) break;
      MacroParameter parameter;
      PETREL_ASSIGN_OR_RETURN(parameter.name, expect_name());
      parameter.name_id = intern(parameter.name);
      if (skip_operator("=")) {
        PETREL_ASSIGN_OR_RETURN(parameter.default_value, parse_expression(true));
      } else {
        for (const MacroParameter& p : node->parameters) {
          if (p.default_value) return error_at(peek(), "non-default argument follows default argument");
        }
      }
      node->parameters.push_back(std::move(parameter));
    }
    next();
    PETREL_RETURN_IF_ERROR(expect_block_end());
    PETREL_ASSIGN_OR_RETURN(node->body, parse_body({"endmacro"}, "macro"));
    next();
    if (peek().kind == TokenKind::kName) next();  // {% endmacro name %}
    PETREL_RETURN_IF_ERROR(expect_block_end());
    return node;
  }

  Result<NodePtr> parse_filter_block(size_t offset) {
    auto node = std::make_unique<Node>();
    node->kind = NodeKind::kFilterBlock;
    node->offset = offset;
    // The filter chain is parsed as if applied to an empty literal placeholder.
    ExprPtr placeholder = make_expr(ExprKind::kLiteral, offset);
    PETREL_ASSIGN_OR_RETURN(node->expr, parse_filter(std::move(placeholder)));
    while (at_operator("|")) {
      next();
      PETREL_ASSIGN_OR_RETURN(node->expr, parse_filter(std::move(node->expr)));
    }
    PETREL_RETURN_IF_ERROR(expect_block_end());
    PETREL_ASSIGN_OR_RETURN(node->body, parse_body({"endfilter"}, "filter"));
    next();
    PETREL_RETURN_IF_ERROR(expect_block_end());
    return node;
  }

  // ------------------------------------------------------------ expressions

  // A comma-separated tuple without parentheses, or a single expression.
  Result<ExprPtr> parse_tuple(bool with_condition, bool explicit_parentheses, bool stop_at_if = false) {
    size_t offset = peek().offset;
    std::vector<ExprPtr> items;
    bool saw_comma = false;
    while (true) {
      if (!items.empty()) {
        if (!skip_operator(",")) break;
        saw_comma = true;
      }
      if (is_tuple_end(explicit_parentheses, stop_at_if)) break;
      PETREL_ASSIGN_OR_RETURN(ExprPtr item, parse_expression(with_condition));
      items.push_back(std::move(item));
      if (!at_operator(",")) break;
    }
    if (!saw_comma && items.size() == 1) return std::move(items[0]);
    if (items.empty() && !explicit_parentheses) return unexpected("an expression");
    ExprPtr tuple = make_expr(ExprKind::kTuple, offset);
    tuple->children = std::move(items);
    return tuple;
  }

  bool is_tuple_end(bool explicit_parentheses, bool stop_at_if) const {
    const Token& t = peek();
    if (t.kind == TokenKind::kVariableEnd || t.kind == TokenKind::kBlockEnd || t.kind == TokenKind::kEnd) return true;
    if (explicit_parentheses && at_operator(")")) return true;
    if (stop_at_if && at_name("if")) return true;
    return false;
  }

  Result<ExprPtr> parse_expression(bool with_condition) {
    DepthGuard guard(*this);
    PETREL_RETURN_IF_ERROR(guard.check());
    if (!with_condition) return parse_or();
    size_t offset = peek().offset;
    PETREL_ASSIGN_OR_RETURN(ExprPtr expr, parse_or());
    while (skip_name("if")) {
      ExprPtr node = make_expr(ExprKind::kCondition, offset);
      PETREL_ASSIGN_OR_RETURN(ExprPtr condition, parse_or());
      node->children.push_back(std::move(condition));
      node->children.push_back(std::move(expr));
      if (skip_name("else")) {
        PETREL_ASSIGN_OR_RETURN(ExprPtr otherwise, parse_expression(true));
        node->children.push_back(std::move(otherwise));
      } else {
        node->children.push_back(nullptr);
      }
      expr = std::move(node);
    }
    return expr;
  }

  Result<ExprPtr> parse_or() {
    PETREL_ASSIGN_OR_RETURN(ExprPtr left, parse_and());
    while (at_name("or")) {
      ExprPtr node = make_expr(ExprKind::kOr, next().offset);
      PETREL_ASSIGN_OR_RETURN(ExprPtr right, parse_and());
      node->children.push_back(std::move(left));
      node->children.push_back(std::move(right));
      left = std::move(node);
    }
    return left;
  }

  Result<ExprPtr> parse_and() {
    PETREL_ASSIGN_OR_RETURN(ExprPtr left, parse_not());
    while (at_name("and")) {
      ExprPtr node = make_expr(ExprKind::kAnd, next().offset);
      PETREL_ASSIGN_OR_RETURN(ExprPtr right, parse_not());
      node->children.push_back(std::move(left));
      node->children.push_back(std::move(right));
      left = std::move(node);
    }
    return left;
  }

  Result<ExprPtr> parse_not() {
    if (at_name("not")) {
      DepthGuard guard(*this);
      PETREL_RETURN_IF_ERROR(guard.check());
      ExprPtr node = make_expr(ExprKind::kNot, next().offset);
      PETREL_ASSIGN_OR_RETURN(ExprPtr operand, parse_not());
      node->children.push_back(std::move(operand));
      return node;
    }
    return parse_compare();
  }

  Result<ExprPtr> parse_compare() {
    size_t offset = peek().offset;
    PETREL_ASSIGN_OR_RETURN(ExprPtr first, parse_math1());
    ExprPtr node;
    while (true) {
      CompareOp op;
      if (at_operator("==")) op = CompareOp::kEq;
      else if (at_operator("!=")) op = CompareOp::kNe;
      else if (at_operator("<")) op = CompareOp::kLt;
      else if (at_operator("<=")) op = CompareOp::kLe;
      else if (at_operator(">")) op = CompareOp::kGt;
      else if (at_operator(">=")) op = CompareOp::kGe;
      else if (at_name("in")) op = CompareOp::kIn;
      else if (at_name("not") && at_name("in", 1)) op = CompareOp::kNotIn;
      else break;
      next();
      if (op == CompareOp::kNotIn) next();
      if (!node) {
        node = make_expr(ExprKind::kCompare, offset);
        node->children.push_back(std::move(first));
      }
      PETREL_ASSIGN_OR_RETURN(ExprPtr right, parse_math1());
      node->compare_ops.push_back(op);
      node->children.push_back(std::move(right));
    }
    if (!node) return first;
    return node;
  }

  Result<ExprPtr> binary(BinaryOp op, size_t offset, ExprPtr left, ExprPtr right) {
    ExprPtr node = make_expr(ExprKind::kBinary, offset);
    node->binary_op = op;
    node->children.push_back(std::move(left));
    node->children.push_back(std::move(right));
    return node;
  }

  Result<ExprPtr> parse_math1() {
    PETREL_ASSIGN_OR_RETURN(ExprPtr left, parse_concat());
    while (at_operator("+") || at_operator("-")) {
      const Token& op = next();
      BinaryOp kind = op.text == "+" ? BinaryOp::kAdd : BinaryOp::kSub;
      PETREL_ASSIGN_OR_RETURN(ExprPtr right, parse_concat());
      PETREL_ASSIGN_OR_RETURN(left, binary(kind, op.offset, std::move(left), std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> parse_concat() {
    size_t offset = peek().offset;
    PETREL_ASSIGN_OR_RETURN(ExprPtr first, parse_math2());
    if (!at_operator("~")) return first;
    ExprPtr node = make_expr(ExprKind::kConcat, offset);
    node->children.push_back(std::move(first));
    while (skip_operator("~")) {
      PETREL_ASSIGN_OR_RETURN(ExprPtr next_part, parse_math2());
      node->children.push_back(std::move(next_part));
    }
    return node;
  }

  Result<ExprPtr> parse_math2() {
    PETREL_ASSIGN_OR_RETURN(ExprPtr left, parse_pow());
    while (at_operator("*") || at_operator("/") || at_operator("//") || at_operator("%")) {
      const Token& op = next();
      BinaryOp kind = op.text == "*"    ? BinaryOp::kMul
                      : op.text == "/"  ? BinaryOp::kDiv
                      : op.text == "//" ? BinaryOp::kFloorDiv
                                        : BinaryOp::kMod;
      PETREL_ASSIGN_OR_RETURN(ExprPtr right, parse_pow());
      PETREL_ASSIGN_OR_RETURN(left, binary(kind, op.offset, std::move(left), std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> parse_pow() {
    PETREL_ASSIGN_OR_RETURN(ExprPtr left, parse_unary(true));
    while (at_operator("**")) {
      const Token& op = next();
      PETREL_ASSIGN_OR_RETURN(ExprPtr right, parse_unary(true));
      PETREL_ASSIGN_OR_RETURN(left, binary(BinaryOp::kPow, op.offset, std::move(left), std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    PETREL_RETURN_IF_ERROR(guard.check());
    ExprPtr node;
    if (at_operator("-") || at_operator("+")) {
      const Token& op = next();
      node = make_expr(op.text == "-" ? ExprKind::kNegate : ExprKind::kPlus, op.offset);
      PETREL_ASSIGN_OR_RETURN(ExprPtr operand, parse_unary(false));
      node->children.push_back(std::move(operand));
    } else {
      PETREL_ASSIGN_OR_RETURN(node, parse_primary());
    }
    PETREL_ASSIGN_OR_RETURN(node, parse_postfix(std::move(node)));
    if (with_filter) {
      PETREL_ASSIGN_OR_RETURN(node, parse_filter_expression(std::move(node)));
    }
    return node;
  }

  Result<ExprPtr> parse_primary() {
    const Token& t = peek();
    switch (t.kind) {
      case TokenKind::kName: {
        next();
        ExprPtr node = make_expr(ExprKind::kLiteral, t.offset);
        if (t.text == "true" || t.text == "True") node->literal = Value::boolean(true);
        else if (t.text == "false" || t.text == "False") node->literal = Value::boolean(false);
        else if (t.text == "none" || t.text == "None") node->literal = Value::none();
        else {
          node->kind = ExprKind::kName;
          node->name = t.text;
          node->name_id = intern(t.text);
        }
        return node;
      }
      case TokenKind::kString: {
        ExprPtr node = make_expr(ExprKind::kLiteral, t.offset);
        std::string text;
        while (peek().kind == TokenKind::kString) text += next().text;  // adjacent literals concatenate
        node->literal = Value::string(std::move(text));
        return node;
      }
      case TokenKind::kInteger: {
        next();
        ExprPtr node = make_expr(ExprKind::kLiteral, t.offset);
        node->literal = Value::integer(t.integer);
        return node;
      }
      case TokenKind::kFloat: {
        next();
        ExprPtr node = make_expr(ExprKind::kLiteral, t.offset);
        node->literal = Value::floating(t.number);
        return node;
      }
      case TokenKind::kOperator:
        if (t.text == "(") {
          next();
          PETREL_ASSIGN_OR_RETURN(ExprPtr inner, parse_tuple(true, true));
          PETREL_RETURN_IF_ERROR(expect_operator(")"));
          return inner;
        }
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        break;
      default: break;
    }
    return error_at(t, "unexpected " + describe(t));
  }

  Result<ExprPtr> parse_list() {
    ExprPtr node = make_expr(ExprKind::kList, next().offset);
    while (!at_operator("]")) {
      if (!node->children.empty()) PETREL_RETURN_IF_ERROR(expect_operator(","));
      if (at_operator("]")) break;
      PETREL_ASSIGN_OR_RETURN(ExprPtr item, parse_expression(true));
      node->children.push_back(std::move(item));
    }
    next();
    return node;
  }

  Result<ExprPtr> parse_dict() {
    ExprPtr node = make_expr(ExprKind::kDict, next().offset);
    while (!at_operator("}")) {
      if (!node->children.empty()) PETREL_RETURN_IF_ERROR(expect_operator(","));
      if (at_operator("}")) break;
      PETREL_ASSIGN_OR_RETURN(ExprPtr key, parse_expression(true));
      PETREL_RETURN_IF_ERROR(expect_operator(":"));
      PETREL_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
      node->children.push_back(std::move(key));
      node->children.push_back(std::move(value));
    }
    next();
    return node;
  }

  Result<ExprPtr> parse_postfix(ExprPtr node) {
    while (true) {
      if (at_operator(".")) {
        const Token& dot = next();
        ExprPtr attr = make_expr(ExprKind::kGetAttr, dot.offset);
        if (peek().kind == TokenKind::kName) {
          attr->name = next().text;
        } else if (peek().kind == TokenKind::kInteger) {
          attr->kind = ExprKind::kGetItem;
          ExprPtr index = make_expr(ExprKind::kLiteral, peek().offset);
          index->literal = Value::integer(next().integer);
          attr->children.push_back(std::move(node));
          attr->children.push_back(std::move(index));
          node = std::move(attr);
          continue;
        } else {
          return unexpected("an attribute name");
        }
        attr->children.push_back(std::move(node));
        node = std::move(attr);
      } else if (at_operator("[")) {
        PETREL_ASSIGN_OR_RETURN(node, parse_subscript(std::move(node)));
      } else if (at_operator("(")) {
        PETREL_ASSIGN_OR_RETURN(node, parse_call(std::move(node)));
      } else {
        return node;
      }
    }
  }

  Result<ExprPtr> parse_subscript(ExprPtr target) {
    const Token& open = next();
    // A slice has at least one ':' at the top level of the brackets.
    ExprPtr parts[3];
    int part = 0;
    bool is_slice = false;
    while (!at_operator("]")) {
      if (at_operator(":")) {
        next();
        is_slice = true;
        if (++part > 2) return error_at(peek(), "too many ':' in slice");
        continue;
      }
      if (parts[part]) return unexpected("']'");
      PETREL_ASSIGN_OR_RETURN(parts[part], parse_expression(true));
      if (!is_slice && at_operator(",")) return error_at(peek(), "tuple subscripts are not supported");
    }
    next();
    if (!is_slice) {
      if (!parts[0]) return error_at(open, "empty subscript");
      ExprPtr node = make_expr(ExprKind::kGetItem, open.offset);
      node->children.push_back(std::move(target));
      node->children.push_back(std::move(parts[0]));
      return node;
    }
    ExprPtr node = make_expr(ExprKind::kSlice, open.offset);
    node->children.push_back(std::move(target));
    for (ExprPtr& p : parts) node->children.push_back(std::move(p));
    return node;
  }

  Status parse_arguments(CallArguments& arguments) {
    PETREL_RETURN_IF_ERROR(expect_operator("("));
    bool first = true;
    while (!at_operator(")")) {
      if (!first) PETREL_RETURN_IF_ERROR(expect_operator(","));
      first = false;
      if (at_operator(")")) break;
      if (at_operator("*") || at_operator("**")) return error_at(peek(), "*args and **kwargs are not supported");
      if (peek().kind == TokenKind::kName && at_operator("=", 1)) {
        std::string key = next().text;
        next();
        PETREL_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
        arguments.keyword.emplace_back(std::move(key), std::move(value));
      } else {
        if (!arguments.keyword.empty()) return error_at(peek(), "positional argument follows keyword argument");
        PETREL_ASSIGN_OR_RETURN(ExprPtr value, parse_expression(true));
        arguments.positional.push_back(std::move(value));
      }
    }
    next();
    return ok_status();
  }

  Result<ExprPtr> parse_call(ExprPtr callee) {
    ExprPtr node = make_expr(ExprKind::kCall, peek().offset);
    PETREL_RETURN_IF_ERROR(parse_arguments(node->arguments));
    node->children.push_back(std::move(callee));
    return node;
  }

  Result<ExprPtr> parse_filter_expression(ExprPtr node) {
    while (true) {
      if (at_operator("|")) {
        next();
        PETREL_ASSIGN_OR_RETURN(node, parse_filter(std::move(node)));
      } else if (at_name("is")) {
        next();
        PETREL_ASSIGN_OR_RETURN(node, parse_test(std::move(node)));
      } else if (at_operator("(")) {
        PETREL_ASSIGN_OR_RETURN(node, parse_call(std::move(node)));
      } else {
        return node;
      }
    }
  }

  Result<ExprPtr> parse_filter(ExprPtr input) {
    const Token& name_token = peek();
    PETREL_ASSIGN_OR_RETURN(std::string name, expect_name());
    if (!is_known_filter(name)) return error_at(name_token, "no filter named '" + name + "'");
    ExprPtr node = make_expr(ExprKind::kFilter, name_token.offset);
    node->name = std::move(name);
    if (at_operator("(")) PETREL_RETURN_IF_ERROR(parse_arguments(node->arguments));
    node->children.push_back(std::move(input));
    return node;
  }

  Result<ExprPtr> parse_test(ExprPtr input) {
    ExprPtr node = make_expr(ExprKind::kTest, peek().offset);
    if (skip_name("not")) node->negated = true;
    const Token& name_token = peek();
    std::string name;
    if (name_token.kind == TokenKind::kName) {
      name = next().text;
    } else if (name_token.kind == TokenKind::kOperator &&
               (name_token.text == "==" || name_token.text == "!=" || name_token.text == "<" ||
                name_token.text == "<=" || name_token.text == ">" || name_token.text == ">=")) {
      name = next().text;
    } else {
      return unexpected("a test name");
    }
    if (!is_known_test(name)) return error_at(name_token, "no test named '" + name + "'");
    node->name = name;
    if (at_operator("(")) {
      PETREL_RETURN_IF_ERROR(parse_arguments(node->arguments));
    } else {
      // Jinja2 allows one argument without parentheses: `x is divisibleby 3`, `x is sameas none`.
      const Token& t = peek();
      bool starts_argument = t.kind == TokenKind::kName || t.kind == TokenKind::kString ||
                             t.kind == TokenKind::kInteger || t.kind == TokenKind::kFloat ||
                             at_operator("[") || at_operator("{");
      if (starts_argument && !at_name("else") && !at_name("or") && !at_name("and") && !at_name("is") &&
          !at_name("if") && !at_name("in") && !at_name("not")) {
        PETREL_ASSIGN_OR_RETURN(ExprPtr argument, parse_primary());
        PETREL_ASSIGN_OR_RETURN(argument, parse_postfix(std::move(argument)));
        node->arguments.positional.push_back(std::move(argument));
      }
    }
    node->children.push_back(std::move(input));
    return node;
  }

  const std::vector<Token>& tokens_;
  Template& tpl_;
  int max_depth_;
  int depth_ = 0;
  size_t pos_ = 0;
  std::unordered_map<std::string, int> symbol_ids_;
};

}  // namespace

Result<std::shared_ptr<const Template>> parse_template(std::string_view source, std::string name,
                                                       int max_nesting_depth) {
  auto tpl = std::make_shared<Template>();
  tpl->name = std::move(name);
  tpl->source = normalize_template_source(source);
  PETREL_ASSIGN_OR_RETURN(std::vector<Token> tokens, tokenize_template(tpl->source, tpl->name));
  Parser parser(tokens, *tpl, max_nesting_depth);
  PETREL_RETURN_IF_ERROR(parser.parse());
  return std::shared_ptr<const Template>(std::move(tpl));
}

}  // namespace petrel::jinja
