// BFCL-style tool-calling evaluation: petrel's AST checker against BFCL's own (verdicts recorded by
// tests/data/bfcl/make_checker_cases.py from bfcl-eval's ast_checker.py), the tool conversion, scoring of
// answers, and `petrel eval bfcl` end to end against an oracle endpoint (all correct) and in process on
// tiny-llama31 (runs and reports).
#include "petrel/eval/bfcl.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <fstream>
#include <map>
#include <thread>

#include "petrel/runtime/session.h"
#include "petrel/serve/server.h"
#include "test_util.h"

namespace petrel::eval {
namespace {

using ojson = nlohmann::ordered_json;
using testing::data_dir;

std::filesystem::path bfcl_dir() { return data_dir() / "bfcl"; }

TEST(Bfcl, CheckerAgreesWithBfclsOwnOnEveryRecordedCase) {
  std::map<std::string, std::map<std::string, BfclEntry>> entries;  // category -> id -> entry
  std::ifstream in(bfcl_dir() / "checker_cases.jsonl");
  ASSERT_TRUE(in) << "missing checker_cases.jsonl";
  std::string line;
  int cases = 0, valid = 0, mismatches = 0;
  std::map<std::string, int> by_error;
  while (std::getline(in, line)) {
    const ojson c = ojson::parse(line);
    const std::string category = c["category"];
    if (!entries.count(category)) {
      auto loaded = load_bfcl_category(bfcl_dir(), category);
      ASSERT_TRUE(loaded.ok()) << loaded.status().to_string();
      for (BfclEntry& e : *loaded) entries[category][e.id] = std::move(e);
    }
    const BfclEntry& e = entries[category].at(c["id"].get<std::string>());
    const AstVerdict v = check_ast(e.functions, c["output"], e.ground_truth, category);
    ++cases;
    valid += c["valid"].get<bool>();
    ++by_error[c["error_type"].get<std::string>()];
    if (v.valid != c["valid"].get<bool>() || v.error_type != c["error_type"].get<std::string>()) {
      if (++mismatches <= 10) {
        ADD_FAILURE() << category << " " << e.id << " " << c["label"] << ": BFCL says " << c["valid"] << " "
                      << c["error_type"] << ", petrel " << v.valid << " " << v.error_type << " (" << v.error
                      << ")\n  output " << c["output"].dump();
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << cases;
  EXPECT_GT(cases, 1000);
  EXPECT_GT(valid, 300);           // correct outputs and allowed changes
  EXPECT_GT(by_error.size(), 10u);  // and many kinds of failure
}

TEST(Bfcl, StandardizeAndToolConversion) {
  EXPECT_EQ(bfcl_standardize("April 1, 2024"), "april12024");
  EXPECT_EQ(bfcl_standardize("New York, NY"), "newyorkny");
  EXPECT_EQ(bfcl_standardize("it's a_b-c*d^e/f."), "it\"sabcdef");
  EXPECT_EQ(bfcl_standardize("DIVINÓPOLIS, MG"), "divinópolismg");  // Python lower-cases beyond ASCII
  EXPECT_EQ(bfcl_standardize("ŁÓDŹ ΑΘΗΝΑ МОСКВА"), "łódźαθηναмосква");
  EXPECT_EQ(bfcl_standardize(std::string("a\xff\xc3" "B")), std::string("a\xff\xc3" "b"));  // bytes that are not UTF-8 stay
  const ojson f = ojson::parse(R"({"name": "math.hypot", "description": "d", "parameters": {"type": "dict",
      "properties": {"x": {"type": "float"}, "pts": {"type": "tuple", "items": {"type": "any"}},
      "opts": {"type": "dict", "properties": {"k": {"type": "integer"}}}}, "required": ["x"]}})");
  const ojson tool = bfcl_tool_from_function(f);
  EXPECT_EQ(tool["type"], "function");
  EXPECT_EQ(tool["function"]["name"], "math_hypot");
  const ojson& p = tool["function"]["parameters"];
  EXPECT_EQ(p["type"], "object");
  EXPECT_EQ(p["properties"]["x"]["type"], "number");
  EXPECT_EQ(p["properties"]["pts"]["type"], "array");
  EXPECT_EQ(p["properties"]["pts"]["items"]["type"], "string");
  EXPECT_EQ(p["properties"]["opts"]["type"], "object");
  EXPECT_EQ(p["properties"]["opts"]["properties"]["k"]["type"], "integer");
  EXPECT_EQ(p["required"], ojson::array({"x"}));
}

TEST(Bfcl, ScoringCountsEmptyAnswersAndErrorsApart) {
  BfclEntry e;
  e.id = "x";
  BfclAnswer text;
  text.ok = true;
  text.content = "I cannot help with that.";
  EXPECT_TRUE(score_bfcl_answer(e, "irrelevance", text).correct);
  BfclAnswer blank;
  blank.ok = true;
  blank.content = "  \n";
  EXPECT_EQ(score_bfcl_answer(e, "irrelevance", blank).outcome, "empty");  // not a correct "no call"
  BfclAnswer failed;
  failed.error = "timeout";
  EXPECT_EQ(score_bfcl_answer(e, "live_irrelevance", failed).outcome, "error");
  BfclAnswer call;
  call.ok = true;
  call.calls = {{"f", "{}"}};
  EXPECT_FALSE(score_bfcl_answer(e, "irrelevance", call).correct);
  EXPECT_TRUE(score_bfcl_answer(e, "live_relevance", call).correct);
  // Someone else's malformed answers are errors, not crashes.
  for (const char* body : {R"({"choices": [{"message": {"tool_calls": [{"function": {"name": 5}}]}}]})",
                           R"({"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": "many"}})",
                           R"({"choices": "none"})", R"({"error": 3})", "[]"}) {
    const BfclAnswer a = bfcl_answer_from_response(ojson::parse(body));
    EXPECT_TRUE(!a.ok || a.calls.empty()) << body;
    if (!a.ok) {
      EXPECT_FALSE(a.error.empty()) << body;
    }
  }
  // AST: arguments that are not an object cannot be decoded.
  auto loaded = load_bfcl_category(bfcl_dir(), "simple_python", 1);
  ASSERT_TRUE(loaded.ok());
  BfclAnswer bad_args;
  bad_args.ok = true;
  bad_args.calls = {{"calculate_triangle_area", "[1]"}};
  EXPECT_EQ(score_bfcl_answer((*loaded)[0], "simple_python", bad_args).error_type, "ast_decoder:decoder_wrong_output_format");
  EXPECT_EQ(score_bfcl_answer((*loaded)[0], "simple_python", text).error_type, "ast_decoder:decoder_failed");
}

TEST(Bfcl, LoadingNamesTheFileAndLine) {
  testing::TempDir dir("bfcl_bad");
  std::filesystem::create_directories(dir / "possible_answer");
  {
    std::ofstream(dir / "BFCL_v4_simple_python.json") << "{\"id\": \"a\", \"question\": [[]], \"function\": []}\nnot json\n";
    std::ofstream(dir / "possible_answer/BFCL_v4_simple_python.json") << "{\"id\": \"a\", \"ground_truth\": []}\n";
  }
  auto bad = load_bfcl_category(dir.path(), "simple_python");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("BFCL_v4_simple_python.json:2"), std::string::npos) << bad.status().message();
  auto missing = load_bfcl_category(dir.path(), "multiple");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("BFCL_v4_multiple.json"), std::string::npos);
}

// An OpenAI endpoint that answers every question with the first acceptable call: `petrel eval bfcl --endpoint`
// must score it 100% on the AST categories.
TEST(Bfcl, EvalCommandScoresAnOracleEndpointAllCorrect) {
  std::map<std::string, ojson> truth_by_question;  // the user's text -> ground truth
  for (const char* category : {"simple_python", "parallel", "multiple"}) {
    auto loaded = load_bfcl_category(bfcl_dir(), category, 4);
    ASSERT_TRUE(loaded.ok());
    for (const BfclEntry& e : *loaded) truth_by_question[e.messages.back()["content"].get<std::string>()] = e.ground_truth;
  }
  httplib::Server oracle;
  oracle.Post("/v1/chat/completions", [&](const httplib::Request& req, httplib::Response& res) {
    const ojson body = ojson::parse(req.body);
    const ojson& truth = truth_by_question.at(body["messages"].back()["content"].get<std::string>());
    ojson calls = ojson::array();
    for (const ojson& call : truth) {
      std::string name = call.begin().key();
      for (char& ch : name) ch = ch == '.' ? '_' : ch;
      ojson args = ojson::object();
      for (auto it = call.begin().value().begin(); it != call.begin().value().end(); ++it) {
        for (const ojson& v : it.value()) {
          if (!(v.is_string() && v.get<std::string>().empty())) {
            args[it.key()] = v;
            break;
          }
        }
      }
      calls.push_back({{"id", "c"}, {"type", "function"}, {"function", {{"name", name}, {"arguments", args.dump()}}}});
    }
    const ojson answer = {{"choices", {{{"index", 0}, {"message", {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", calls}}},
                                        {"finish_reason", "tool_calls"}}}},
                          {"usage", {{"prompt_tokens", 5}, {"completion_tokens", 7}}}};
    res.set_content(answer.dump(), "application/json");
  });
  const int port = oracle.bind_to_any_port("127.0.0.1");
  std::thread serving([&] { oracle.listen_after_bind(); });
  testing::TempDir dir("bfcl_oracle");
  const auto run = testing::run_command(testing::cli() + " eval bfcl --endpoint http://127.0.0.1:" + std::to_string(port) +
                                        "/v1 --categories simple_python,parallel,multiple --limit 4 -o " + (dir / "r.json").string());
  oracle.stop();
  serving.join();
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("| all | 12 | 12 | 100.0% |"), std::string::npos) << run.output;
  std::ifstream report(dir / "r.json");
  const ojson r = ojson::parse(report);
  EXPECT_EQ(r["summary"]["accuracy_overall"], 1.0);
  EXPECT_EQ(r["categories"][0]["prompt_tokens"], 4 * 5);
  EXPECT_EQ(r["categories"][0]["entries"][0]["outcome"], "correct");
}

// The same model in process and behind `petrel serve`: the same answers, entry by entry (one code path).
TEST(Bfcl, InProcessAndThroughTheServerGiveTheSameAnswers) {
  auto engine = Engine::load(data_dir() / "models/tiny-llama31");
  ASSERT_TRUE(engine.ok());
  auto generator = serve::EngineGenerator::create(*engine, 4096);
  ASSERT_TRUE(generator.ok());
  serve::ServerOptions options;
  options.port = 0;
  options.completion.tool_format = (*generator)->detected_tool_format();
  options.completion.template_writes_tools = (*generator)->template_writes_tools();
  options.completion.limits.max_tokens = 4096;
  serve::Server server(std::shared_ptr<serve::ChatGenerator>(std::move(*generator)), options);
  ASSERT_TRUE(server.bind().ok());
  std::thread serving([&] { EXPECT_TRUE(server.run().ok()); });
  testing::TempDir dir("bfcl_same");
  const std::string common = " eval bfcl --categories simple_python,parallel,irrelevance --limit 2 --max-tokens 24 -t 1 -o ";
  const auto http = testing::run_command(testing::cli() + common + (dir / "http.json").string() + " --endpoint http://127.0.0.1:" +
                                         std::to_string(server.port()) + "/v1");
  server.stop();
  serving.join();
  const auto local = testing::run_command(testing::cli() + common + (dir / "local.json").string() + " --model " +
                                          (data_dir() / "models/tiny-llama31").string());
  ASSERT_EQ(http.exit_code, 0) << http.output;
  ASSERT_EQ(local.exit_code, 0) << local.output;
  const ojson a = ojson::parse(std::ifstream(dir / "http.json"));
  const ojson b = ojson::parse(std::ifstream(dir / "local.json"));
  ASSERT_EQ(a["categories"].size(), 3u);
  for (size_t c = 0; c < 3; ++c) {
    ASSERT_EQ(a["categories"][c]["entries"].size(), 2u);
    EXPECT_EQ(a["categories"][c]["errors"], 0);
    for (size_t e = 0; e < 2; ++e) {
      EXPECT_EQ(a["categories"][c]["entries"][e]["output"], b["categories"][c]["entries"][e]["output"]) << c << " " << e;
      EXPECT_EQ(a["categories"][c]["entries"][e]["outcome"], b["categories"][c]["entries"][e]["outcome"]);
    }
    EXPECT_EQ(a["categories"][c]["completion_tokens"], b["categories"][c]["completion_tokens"]);
  }
}

TEST(Bfcl, EvalCommandRunsInProcessAndRefusesBadFlags) {
  testing::TempDir dir("bfcl_tiny");
  const auto run = testing::run_command(testing::cli() + " eval bfcl --model " + (data_dir() / "models/tiny-llama31").string() +
                                        " --categories simple_python,irrelevance --limit 2 --max-tokens 24 -t 1 -o " +
                                        (dir / "r.json").string());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::ifstream report(dir / "r.json");
  const ojson r = ojson::parse(report);
  EXPECT_EQ(r["summary"]["entries"], 4);
  EXPECT_EQ(r["meta"]["tool_format"], "llama3-json");
  for (const ojson& c : r["categories"]) EXPECT_EQ(c["errors"], 0) << c.dump();

  EXPECT_EQ(testing::run_command(testing::cli() + " eval bfcl").exit_code, 2);  // neither --model nor --endpoint
  const auto missing = testing::run_command(testing::cli() + " eval bfcl --endpoint http://127.0.0.1:1/v1 --data /nonexistent");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.output.find("/nonexistent/BFCL_v4_simple_python.json"), std::string::npos) << missing.output;
}

}  // namespace
}  // namespace petrel::eval
