#include "petrel/text/jinja_evaluator.h"

#include <cmath>

#include "petrel/text/jinja_builtins.h"
#include "petrel/text/jinja_lexer.h"
#include "petrel/text/jinja_operators.h"

namespace petrel::jinja {
namespace {

enum class Control { kNone, kBreak, kContinue };

struct Frame {
  std::vector<std::pair<int, Value>> variables;
  bool macro_boundary = false;  // lookups skip from here straight to the top-level frame

  Value* find(int id) {
    for (auto& [key, value] : variables) {
      if (key == id) return &value;
    }
    return nullptr;
  }
  void set(int id, Value value) {
    if (Value* existing = find(id)) {
      *existing = std::move(value);
    } else {
      variables.emplace_back(id, std::move(value));
    }
  }
};

class Renderer final : public BuiltinContext {
 public:
  Renderer(const Template& tpl, const RenderSettings& settings) : tpl_(tpl), settings_(settings) {}

  Result<TString> render(const std::vector<std::pair<std::string, Value>>& variables) {
    frames_.reserve(16);
    frames_.emplace_back();
    for (const std::string& name : global_function_names()) {
      int id = tpl_.symbol_id(name);
      if (id < 0) continue;
      auto callable = std::make_shared<CallableObject>();
      callable->kind = CallableKind::kGlobalFunction;
      callable->name = name;
      frames_[0].set(id, Value::callable(std::move(callable)));
    }
    for (const auto& [name, value] : variables) {
      int id = tpl_.symbol_id(name);
      if (id >= 0) frames_[0].set(id, value);
    }
    TString output;
    out_ = &output;
    PETREL_RETURN_IF_ERROR(exec_body(tpl_.body));
    return output;
  }

  // ------------------------------------------------------------ BuiltinContext
  Status check_size(size_t bytes) override {
    if (bytes > settings_.max_output_bytes) {
      return out_of_range("rendering stopped: a string or the output exceeds max_output_bytes (" +
                          std::to_string(settings_.max_output_bytes) + ")");
    }
    return ok_status();
  }
  Status count_steps(size_t steps) override {
    steps_ += steps;
    if (steps_ > settings_.max_steps) {
      return out_of_range("rendering stopped: more than max_steps (" + std::to_string(settings_.max_steps) +
                          ") evaluation steps; the template may loop without end");
    }
    return ok_status();
  }
  const std::tm& now() const override { return settings_.now; }
  int max_nesting_depth() const override { return settings_.max_nesting_depth; }

 private:
  // ------------------------------------------------------------ errors
  Status locate(Status status, size_t offset) {
    if (status.ok() || located_) return status;
    located_ = true;
    return Status(status.code(), located_message(tpl_.name, tpl_.source, offset, status.message()));
  }

  // ------------------------------------------------------------ scopes
  Value* lookup(int id) {
    size_t i = frames_.size() - 1;
    while (true) {
      if (Value* v = frames_[i].find(id)) return v;
      if (i == 0) return nullptr;
      i = frames_[i].macro_boundary ? 0 : i - 1;
    }
  }

  Status assign(const Target& target, Value value) {
    if (target.attribute.empty()) {
      frames_.back().set(target.name_id, std::move(value));
      return ok_status();
    }
    Value* object = lookup(target.name_id);
    if (object == nullptr || object->kind() != ValueKind::kNamespace) {
      return invalid_argument("TemplateRuntimeError: cannot assign attribute on non-namespace object '" +
                              target.name + "'");
    }
    auto& attributes = object->as_namespace().attributes;
    for (auto& [key, existing] : attributes) {
      if (key == target.attribute) {
        existing = std::move(value);
        return ok_status();
      }
    }
    attributes.emplace_back(target.attribute, std::move(value));
    return ok_status();
  }

  Status assign_targets(const std::vector<Target>& targets, const Value& value) {
    if (targets.size() == 1) return assign(targets[0], value);
    if (!value.is_list()) {
      return invalid_argument(std::string("TypeError: cannot unpack non-iterable ") + python_type_name(value) +
                              " object");
    }
    const auto& items = value.items();
    if (items.size() != targets.size()) {
      return invalid_argument(items.size() < targets.size()
                                  ? "ValueError: not enough values to unpack (expected " +
                                        std::to_string(targets.size()) + ", got " + std::to_string(items.size()) + ")"
                                  : "ValueError: too many values to unpack (expected " +
                                        std::to_string(targets.size()) + ")");
    }
    for (size_t i = 0; i < targets.size(); ++i) PETREL_RETURN_IF_ERROR(assign(targets[i], items[i]));
    return ok_status();
  }

  // ------------------------------------------------------------ statements
  Status exec_body(const NodeList& body) {
    for (const NodePtr& node : body) {
      PETREL_RETURN_IF_ERROR(exec(*node));
      if (control_ != Control::kNone) return ok_status();
    }
    return ok_status();
  }

  Status exec(const Node& node) {
    PETREL_RETURN_IF_ERROR(locate(count_steps(1), node.offset));
    switch (node.kind) {
      case NodeKind::kText:
        out_->append(node.text);
        return locate(check_size(out_->size()), node.offset);
      case NodeKind::kOutput: {
        PETREL_ASSIGN_OR_RETURN(Value value, eval(*node.expr));
        if (value.is_string()) {
          out_->append(value.as_tstring());
        } else if (!value.is_undefined()) {
          out_->append(to_tstring(value));
        }
        return locate(check_size(out_->size()), node.offset);
      }
      case NodeKind::kIf:
        for (size_t i = 0; i < node.conditions.size(); ++i) {
          PETREL_ASSIGN_OR_RETURN(Value condition, eval(*node.conditions[i]));
          if (truthy(condition)) return exec_body(node.bodies[i]);
        }
        return exec_body(node.else_body);
      case NodeKind::kFor: return exec_for(node);
      case NodeKind::kSet: {
        PETREL_ASSIGN_OR_RETURN(Value value, eval(*node.expr));
        return locate(assign_targets(node.targets, value), node.offset);
      }
      case NodeKind::kSetBlock: {
        PETREL_ASSIGN_OR_RETURN(TString text, capture(node.body));
        return locate(assign(node.targets[0], Value::string(std::move(text))), node.offset);
      }
      case NodeKind::kMacro: {
        auto callable = std::make_shared<CallableObject>();
        callable->kind = CallableKind::kMacro;
        callable->name = node.macro_name;
        callable->macro = &node;
        frames_.back().set(node.macro_name_id, Value::callable(std::move(callable)));
        return ok_status();
      }
      case NodeKind::kFilterBlock: {
        PETREL_ASSIGN_OR_RETURN(TString text, capture(node.body));
        PETREL_ASSIGN_OR_RETURN(Value value, eval_filter_chain(*node.expr, Value::string(std::move(text))));
        out_->append(to_tstring(value));
        return locate(check_size(out_->size()), node.offset);
      }
      case NodeKind::kBody: return exec_body(node.body);
      case NodeKind::kBreak: control_ = Control::kBreak; return ok_status();
      case NodeKind::kContinue: control_ = Control::kContinue; return ok_status();
    }
    return internal_error("unknown node kind");
  }

  // Renders `body` into a separate buffer (block set, filter blocks, macro calls).
  Result<TString> capture(const NodeList& body) {
    TString buffer;
    TString* saved = out_;
    out_ = &buffer;
    Status status = exec_body(body);
    out_ = saved;
    PETREL_RETURN_IF_ERROR(status);
    return buffer;
  }

  Status exec_for(const Node& node) {
    PETREL_ASSIGN_OR_RETURN(Value iterable, eval(*node.expr));
    auto items_or = iterate_values(iterable);
    if (!items_or.ok()) return locate(items_or.status(), node.expr->offset);
    std::vector<Value> items = std::move(items_or).value();

    frames_.emplace_back();
    if (node.condition) {  // `for x in xs if cond`: loop.index etc. count only the kept items
      std::vector<Value> kept;
      for (Value& item : items) {
        PETREL_RETURN_IF_ERROR(locate(count_loop_iteration(), node.offset));
        frames_.back().variables.clear();
        PETREL_RETURN_IF_ERROR(locate(assign_targets(node.targets, item), node.offset));
        PETREL_ASSIGN_OR_RETURN(Value keep, eval(*node.condition));
        if (truthy(keep)) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    auto loop = std::make_shared<LoopObject>();
    Value items_value = Value::list(std::move(items));
    loop->items = items_value.list_object();
    Value loop_value = Value::loop(loop);
    const auto& list = loop->items->items;
    for (size_t i = 0; i < list.size(); ++i) {
      PETREL_RETURN_IF_ERROR(locate(count_loop_iteration(), node.offset));
      Frame& frame = frames_.back();
      frame.variables.clear();  // Jinja2: assignments in the body do not survive the iteration
      loop->index0 = i;
      frame.set(tpl_.loop_symbol, loop_value);
      PETREL_RETURN_IF_ERROR(locate(assign_targets(node.targets, list[i]), node.offset));
      PETREL_RETURN_IF_ERROR(exec_body(node.body));
      if (control_ == Control::kBreak) {
        control_ = Control::kNone;
        break;
      }
      control_ = Control::kNone;
    }
    frames_.pop_back();
    if (list.empty() && node.has_else) return exec_body(node.else_body);
    return ok_status();
  }

  Status count_loop_iteration() {
    if (++loop_iterations_ > settings_.max_loop_iterations) {
      return out_of_range("rendering stopped: more than max_loop_iterations (" +
                          std::to_string(settings_.max_loop_iterations) + ") loop iterations");
    }
    return ok_status();
  }

  // ------------------------------------------------------------ expressions
  Result<Value> eval(const Expr& e) {
    Result<Value> result = eval_unlocated(e);
    if (!result.ok()) return locate(result.status(), e.offset);
    return result;
  }

  Result<CallValues> eval_arguments(const CallArguments& arguments) {
    CallValues values;
    values.positional.reserve(arguments.positional.size());
    for (const ExprPtr& p : arguments.positional) {
      PETREL_ASSIGN_OR_RETURN(Value v, eval(*p));
      values.positional.push_back(std::move(v));
    }
    for (const auto& [key, expr] : arguments.keyword) {
      PETREL_ASSIGN_OR_RETURN(Value v, eval(*expr));
      values.keyword.emplace_back(key, std::move(v));
    }
    return values;
  }

  Status check_depth(const Value& v) {
    if (v.depth() > settings_.max_nesting_depth) {
      return out_of_range("rendering stopped: a value is nested more than max_nesting_depth (" +
                          std::to_string(settings_.max_nesting_depth) + ") levels deep");
    }
    return ok_status();
  }

  Result<Value> eval_unlocated(const Expr& e) {
    PETREL_RETURN_IF_ERROR(count_steps(1));
    switch (e.kind) {
      case ExprKind::kLiteral: return e.literal;
      case ExprKind::kName: {
        if (Value* v = lookup(e.name_id)) return *v;
        return Value::undefined("'" + e.name + "' is undefined");
      }
      case ExprKind::kList:
      case ExprKind::kTuple: {
        std::vector<Value> items;
        items.reserve(e.children.size());
        for (const ExprPtr& child : e.children) {
          PETREL_ASSIGN_OR_RETURN(Value v, eval(*child));
          items.push_back(std::move(v));
        }
        Value list = Value::list(std::move(items), e.kind == ExprKind::kTuple);
        PETREL_RETURN_IF_ERROR(check_depth(list));
        return list;
      }
      case ExprKind::kDict: {
        std::vector<std::pair<Value, Value>> entries;
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          PETREL_ASSIGN_OR_RETURN(Value key, eval(*e.children[i]));
          PETREL_ASSIGN_OR_RETURN(Value value, eval(*e.children[i + 1]));
          bool replaced = false;
          for (auto& entry : entries) {
            if (values_equal(entry.first, key)) {
              entry.second = value;
              replaced = true;
            }
          }
          if (!replaced) entries.emplace_back(std::move(key), std::move(value));
        }
        Value dict = Value::dict(std::move(entries));
        PETREL_RETURN_IF_ERROR(check_depth(dict));
        return dict;
      }
      case ExprKind::kGetAttr: {
        PETREL_ASSIGN_OR_RETURN(Value object, eval(*e.children[0]));
        if (object.is_undefined()) return invalid_argument("UndefinedError: " + object.undefined_hint());
        return get_attribute(object, e.name);
      }
      case ExprKind::kGetItem: {
        PETREL_ASSIGN_OR_RETURN(Value object, eval(*e.children[0]));
        PETREL_ASSIGN_OR_RETURN(Value key, eval(*e.children[1]));
        if (object.is_undefined()) return invalid_argument("UndefinedError: " + object.undefined_hint());
        return get_item(object, key);
      }
      case ExprKind::kSlice: {
        PETREL_ASSIGN_OR_RETURN(Value object, eval(*e.children[0]));
        if (object.is_undefined()) return invalid_argument("UndefinedError: " + object.undefined_hint());
        Value parts[3];
        const Value* pointers[3] = {nullptr, nullptr, nullptr};
        for (int i = 0; i < 3; ++i) {
          if (!e.children[i + 1]) continue;
          PETREL_ASSIGN_OR_RETURN(parts[i], eval(*e.children[i + 1]));
          if (!parts[i].is_none()) pointers[i] = &parts[i];
        }
        return get_slice(*this, object, pointers[0], pointers[1], pointers[2]);
      }
      case ExprKind::kCall: return eval_call(e);
      case ExprKind::kFilter: {
        PETREL_ASSIGN_OR_RETURN(Value input, eval(*e.children[0]));
        PETREL_ASSIGN_OR_RETURN(CallValues args, eval_arguments(e.arguments));
        PETREL_ASSIGN_OR_RETURN(Value result, apply_filter(*this, e.name, input, args));
        PETREL_RETURN_IF_ERROR(check_depth(result));
        return result;
      }
      case ExprKind::kTest: {
        PETREL_ASSIGN_OR_RETURN(Value input, eval(*e.children[0]));
        PETREL_ASSIGN_OR_RETURN(CallValues args, eval_arguments(e.arguments));
        PETREL_ASSIGN_OR_RETURN(bool passed, apply_test(*this, e.name, input, args));
        return Value::boolean(passed != e.negated);
      }
      case ExprKind::kNot: {
        PETREL_ASSIGN_OR_RETURN(Value v, eval(*e.children[0]));
        return Value::boolean(!truthy(v));
      }
      case ExprKind::kNegate:
      case ExprKind::kPlus: {
        PETREL_ASSIGN_OR_RETURN(Value v, eval(*e.children[0]));
        return unary_operator(e.kind == ExprKind::kNegate, v);
      }
      case ExprKind::kBinary: {
        PETREL_ASSIGN_OR_RETURN(Value left, eval(*e.children[0]));
        PETREL_ASSIGN_OR_RETURN(Value right, eval(*e.children[1]));
        PETREL_ASSIGN_OR_RETURN(Value result, binary_operator(*this, e.binary_op, left, right));
        return result;
      }
      case ExprKind::kConcat: {
        TString text;
        for (const ExprPtr& child : e.children) {
          PETREL_ASSIGN_OR_RETURN(Value v, eval(*child));
          if (v.is_string()) text.append(v.as_tstring());
          else if (!v.is_undefined()) text.append(to_tstring(v));
          PETREL_RETURN_IF_ERROR(check_size(text.size()));
        }
        return Value::string(std::move(text));
      }
      case ExprKind::kCompare: {
        PETREL_ASSIGN_OR_RETURN(Value left, eval(*e.children[0]));
        for (size_t i = 0; i < e.compare_ops.size(); ++i) {
          PETREL_ASSIGN_OR_RETURN(Value right, eval(*e.children[i + 1]));
          PETREL_ASSIGN_OR_RETURN(bool holds, compare_operator(e.compare_ops[i], left, right));
          if (!holds) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case ExprKind::kAnd: {
        PETREL_ASSIGN_OR_RETURN(Value left, eval(*e.children[0]));
        if (!truthy(left)) return left;
        return eval(*e.children[1]);
      }
      case ExprKind::kOr: {
        PETREL_ASSIGN_OR_RETURN(Value left, eval(*e.children[0]));
        if (truthy(left)) return left;
        return eval(*e.children[1]);
      }
      case ExprKind::kCondition: {
        PETREL_ASSIGN_OR_RETURN(Value condition, eval(*e.children[0]));
        if (truthy(condition)) return eval(*e.children[1]);
        if (e.children[2]) return eval(*e.children[2]);
        return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
      }
    }
    return internal_error("unknown expression kind");
  }

  // `{% filter f | g %}`: the innermost filter's input is the rendered body.
  Result<Value> eval_filter_chain(const Expr& e, Value input) {
    if (e.kind != ExprKind::kFilter) return input;
    PETREL_ASSIGN_OR_RETURN(Value inner, eval_filter_chain(*e.children[0], std::move(input)));
    PETREL_ASSIGN_OR_RETURN(CallValues args, eval_arguments(e.arguments));
    auto result = apply_filter(*this, e.name, inner, args);
    if (!result.ok()) return locate(result.status(), e.offset);
    return result;
  }

  Result<Value> eval_call(const Expr& e) {
    const Expr& callee_expr = *e.children[0];
    // Method calls (`s.strip()`, `d.items()`) skip building a bound-method object.
    if (callee_expr.kind == ExprKind::kGetAttr) {
      PETREL_ASSIGN_OR_RETURN(Value object, eval(*callee_expr.children[0]));
      if (object.is_undefined()) return invalid_argument("UndefinedError: " + object.undefined_hint());
      PETREL_ASSIGN_OR_RETURN(Value callee, get_attribute(object, callee_expr.name));
      return call(callee, e.arguments);
    }
    PETREL_ASSIGN_OR_RETURN(Value callee, eval(callee_expr));
    return call(callee, e.arguments);
  }

  Result<Value> call(const Value& callee, const CallArguments& arguments) {
    if (callee.is_undefined()) return invalid_argument("UndefinedError: " + callee.undefined_hint());
    if (!callee.is_callable()) {
      return invalid_argument(std::string("TypeError: '") + python_type_name(callee) + "' object is not callable");
    }
    PETREL_ASSIGN_OR_RETURN(CallValues args, eval_arguments(arguments));
    const CallableObject& callable = callee.as_callable();
    switch (callable.kind) {
      case CallableKind::kMacro: return call_macro(callee, args);
      case CallableKind::kGlobalFunction: return call_global_function(*this, callable.name, args);
      case CallableKind::kMethod: {
        PETREL_ASSIGN_OR_RETURN(Value result, call_method(*this, *callable.self, callable.name, args));
        PETREL_RETURN_IF_ERROR(check_depth(result));
        return result;
      }
    }
    return internal_error("unknown callable kind");
  }

  Result<Value> call_macro(const Value& callee, const CallValues& args) {
    const Node& macro = *callee.as_callable().macro;
    if (call_depth_ >= settings_.max_call_depth) {
      return out_of_range("rendering stopped: macro calls nested more than max_call_depth (" +
                          std::to_string(settings_.max_call_depth) + ") deep (unbounded recursion?)");
    }
    const auto& parameters = macro.parameters;
    if (args.positional.size() > parameters.size()) {
      return invalid_argument("TypeError: macro '" + macro.macro_name + "' takes not more than " +
                              std::to_string(parameters.size()) + " argument(s)");
    }
    for (const auto& [key, value] : args.keyword) {
      bool known = false;
      for (const MacroParameter& p : parameters) known = known || p.name == key;
      if (!known) {
        return invalid_argument("TypeError: macro '" + macro.macro_name + "' takes no keyword argument '" + key + "'");
      }
    }
    Frame frame;
    frame.macro_boundary = true;
    frames_.push_back(std::move(frame));
    frames_.back().set(macro.macro_name_id, callee);  // a macro can call itself by name
    Status status = ok_status();
    for (size_t i = 0; i < parameters.size() && status.ok(); ++i) {
      const MacroParameter& p = parameters[i];
      const Value* given = args.get(i, p.name);
      if (given != nullptr) {
        frames_.back().set(p.name_id, *given);
      } else if (p.default_value) {
        Result<Value> value = eval(*p.default_value);
        if (!value.ok()) {
          status = value.status();
          break;
        }
        frames_.back().set(p.name_id, std::move(value).value());
      } else {
        frames_.back().set(p.name_id, Value::undefined("parameter '" + p.name + "' was not provided"));
      }
    }
    ++call_depth_;
    Result<TString> text = status.ok() ? capture(macro.body) : Result<TString>(status);
    --call_depth_;
    control_ = Control::kNone;
    frames_.pop_back();
    if (!text.ok()) return text.status();
    return Value::string(std::move(text).value());
  }

  const Template& tpl_;
  const RenderSettings& settings_;
  std::vector<Frame> frames_;
  TString* out_ = nullptr;
  Control control_ = Control::kNone;
  uint64_t steps_ = 0;
  uint64_t loop_iterations_ = 0;
  int call_depth_ = 0;
  bool located_ = false;
};

}  // namespace

Result<TString> render_template(const Template& tpl, const std::vector<std::pair<std::string, Value>>& variables,
                                const RenderSettings& settings) {
  Renderer renderer(tpl, settings);
  return renderer.render(variables);
}

}  // namespace petrel::jinja
