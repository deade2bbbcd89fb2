// BFCL-style tool-calling evaluation (`petrel eval bfcl`): the Berkeley Function Calling Leaderboard's AST
// categories, asked of a model through the OpenAI chat protocol (petrel's own server code in process, or any
// OpenAI-compatible endpoint) and scored by a C++ port of BFCL's AST checker.
//
// Data: BFCL's JSON Lines files as published (`BFCL_v4_<category>.json`: {"id", "question": [[messages]],
// "function": [schemas]}, and `possible_answer/BFCL_v4_<category>.json`: {"id", "ground_truth": [{name: {arg:
// [acceptable values]}}]}). tests/data/bfcl holds a subset with its license.
//
// Asking: each entry's first turn, with its functions as OpenAI tools, the way BFCL's function-calling mode sends
// them to OpenAI-style models (bfcl_tool_from_function: types dict->object, float->number, tuple->array,
// any->string; "." in names -> "_"), greedy unless told otherwise. The answer's tool_calls decode to BFCL's
// model output [{name: arguments}, ...].
//
// Scoring (check_ast, the rules of bfcl_eval/eval_checker/ast_eval/ast_checker.py for Python, with Python's
// equality where it compares values: 1 == 1.0 == True): categories whose name holds "parallel" match calls in any
// order, "multiple" check the one expected call against its function's schema, the rest need exactly one call;
// names, required and unexpected parameters, Python types (int promoted to float; a value of the answer's type
// counts as a "variable"), strings compared after BFCL's normalisation, lists in order, dicts key by key.
// Irrelevance categories are correct when the model answers without a call; live_relevance when it makes at
// least one. One deliberate difference from BFCL's runner: an empty answer, an error or a timeout is never
// counted as a correct "no call" (BFCL counts any output that does not decode as one); they are counted apart.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "petrel/util/status.h"

namespace petrel::eval {

struct AstVerdict {
  bool valid = false;
  std::string error_type;  // BFCL's, e.g. "simple_function_checker:missing_required"; empty when valid
  std::string error;       // a sentence for people
};

// BFCL's AST check. `functions`: the entry's schemas; `output`: [{name: {arg: value}}]; `ground_truth`: the
// possible answer's list. Function names are compared with "." read as "_" (BFCL's underscore_to_dot models).
AstVerdict check_ast(const nlohmann::ordered_json& functions, const nlohmann::ordered_json& output,
                     const nlohmann::ordered_json& ground_truth, const std::string& category);

// BFCL's string normalisation: drop " ,./-_*^", lower-case (ASCII), and ' -> ".
std::string bfcl_standardize(std::string_view text);

// One BFCL function schema as an OpenAI tool ({"type": "function", "function": {...}}), with BFCL's type names
// mapped to JSON Schema's and "." in the name replaced by "_".
nlohmann::ordered_json bfcl_tool_from_function(const nlohmann::ordered_json& function);

enum class BfclKind { kAst, kIrrelevance, kRelevance };
BfclKind bfcl_kind(const std::string& category);

struct BfclEntry {
  std::string id;
  nlohmann::ordered_json messages;      // the first turn
  nlohmann::ordered_json functions;     // BFCL schemas
  nlohmann::ordered_json ground_truth;  // null for (ir)relevance
};

// Reads data_dir/BFCL_v4_<category>.json and, for AST categories, its possible answers (every entry must have
// one). Errors name the file and line. limit < 0: all entries.
Result<std::vector<BfclEntry>> load_bfcl_category(const std::filesystem::path& data_dir, const std::string& category,
                                                  int64_t limit = -1);

// What the model said: its tool calls (name, arguments as JSON text) and text, or why there is no answer.
struct BfclAnswer {
  bool ok = false;       // false: error (transport, HTTP status, server error, timeout)
  std::string error;
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;
  int64_t prompt_tokens = 0, completion_tokens = 0;
};
// Asks one question: an OpenAI chat.completions request body -> the answer.
using BfclAsk = std::function<BfclAnswer(const nlohmann::ordered_json& request)>;

// A chat.completion (or an error body) as a BfclAnswer.
BfclAnswer bfcl_answer_from_response(const nlohmann::ordered_json& response);

struct BfclOptions {
  int64_t max_tokens = 512;
  std::optional<float> temperature = 0.0f;  // greedy
  nlohmann::ordered_json extra_request;      // merged into every request (e.g. {"reasoning": "off"})
  std::string model_name = "petrel";
};

struct BfclEntryResult {
  std::string id;
  bool correct = false;
  std::string outcome;  // "correct", "wrong", "empty" (no answer text and no call), "error"
  std::string error_type, error;
  nlohmann::ordered_json output;  // the decoded calls [{name: arguments}], or the text
};

struct BfclCategoryResult {
  std::string category;
  int64_t total = 0, correct = 0, empty = 0, errors = 0;
  double seconds = 0;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  std::vector<BfclEntryResult> entries;
  double accuracy() const { return total ? static_cast<double>(correct) / total : 0.0; }
};

// Scores one answer against its entry.
BfclEntryResult score_bfcl_answer(const BfclEntry& entry, const std::string& category, const BfclAnswer& answer);

// Runs a category; progress(done, total) after each entry.
BfclCategoryResult run_bfcl_category(const std::string& category, const std::vector<BfclEntry>& entries,
                                     const BfclAsk& ask, const BfclOptions& options,
                                     const std::function<void(int64_t, int64_t)>& progress = {});

nlohmann::ordered_json bfcl_report_json(const std::vector<BfclCategoryResult>& results, const nlohmann::ordered_json& meta);

}  // namespace petrel::eval
