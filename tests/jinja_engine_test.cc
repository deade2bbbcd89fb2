// The Jinja subset against Python Jinja2: every case of tests/data/templates/jinja_semantics.json
// (made by scripts/template_make_semantics.py) must render the same bytes, or fail where Jinja2 fails.
// Plus direct tests of the Python-semantics helpers and of taint propagation through string operations.
#include <gtest/gtest.h>

#include <ctime>
#include <string>

#include "petrel/text/jinja_evaluator.h"
#include "petrel/text/jinja_lexer.h"
#include "petrel/text/jinja_parser.h"
#include "petrel/text/jinja_value.h"
#include "petrel/util/file.h"

namespace petrel::jinja {
namespace {

using nlohmann::ordered_json;

std::tm fixed_time() {  // the corpus scripts' strftime_now: 2025-03-14 09:26:53, a Friday
  std::tm t{};
  t.tm_year = 125;
  t.tm_mon = 2;
  t.tm_mday = 14;
  t.tm_hour = 9;
  t.tm_min = 26;
  t.tm_sec = 53;
  std::time_t seconds = timegm(&t);
  gmtime_r(&seconds, &t);
  return t;
}

Result<TString> render_with(const std::string& source, const ordered_json& variables, bool untrusted = false) {
  PETREL_ASSIGN_OR_RETURN(auto tpl, parse_template(source, "test", 256));
  std::vector<std::pair<std::string, Value>> values;
  for (auto it = variables.begin(); it != variables.end(); ++it) {
    PETREL_ASSIGN_OR_RETURN(Value v, value_from_json(it.value(), untrusted, 64));
    values.emplace_back(it.key(), std::move(v));
  }
  RenderSettings settings;
  settings.now = fixed_time();
  return render_template(*tpl, values, settings);
}

TEST(JinjaEngine, MatchesJinja2OnTheSemanticsTable) {
  auto text = read_text_file(std::string(PETREL_TEST_DATA_DIR) + "/templates/jinja_semantics.json");
  ASSERT_TRUE(text.ok()) << "run scripts/template_make_semantics.py";
  ordered_json table = ordered_json::parse(*text);
  int checked = 0;
  for (const auto& c : table["cases"]) {
    const std::string name = c["name"].get<std::string>();
    auto rendered = render_with(c["template"].get<std::string>(), table["variables"]);
    ++checked;
    if (c.contains("error")) {
      EXPECT_FALSE(rendered.ok()) << name << ": Jinja2 raised " << c["error"].get<std::string>()
                                  << " but petrel rendered " << ordered_json(rendered->text()).dump();
      continue;
    }
    ASSERT_TRUE(rendered.ok()) << name << ": " << rendered.status().to_string();
    EXPECT_EQ(rendered->text(), c["expected"].get<std::string>()) << name;
  }
  EXPECT_GE(checked, 70);
}

TEST(JinjaEngine, ErrorMessagesFollowPython) {
  auto r = render_with("{{ 'a' + 1 }}", ordered_json::object());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("can only concatenate str (not \"int\") to str"), std::string::npos);
  r = render_with("{{ x.y }}", ordered_json::object());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'x' is undefined"), std::string::npos) << r.status().message();
  // A missing key is Undefined, not an error; only using it further is.
  r = render_with("{{ m.tool_calls is defined }}{{ m.tool_calls | length }}", {{"m", {{"role", "user"}}}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->text(), "False0");
}

TEST(JinjaEngine, PythonFloatRepr) {
  EXPECT_EQ(python_float_repr(1.0), "1.0");
  EXPECT_EQ(python_float_repr(0.1), "0.1");
  EXPECT_EQ(python_float_repr(1e16), "1e+16");
  EXPECT_EQ(python_float_repr(1234567890123456.0), "1234567890123456.0");
  EXPECT_EQ(python_float_repr(0.0001), "0.0001");
  EXPECT_EQ(python_float_repr(0.00001), "1e-05");
  EXPECT_EQ(python_float_repr(-2.5e-310), "-2.5e-310");
  EXPECT_EQ(python_float_repr(1.7976931348623157e308), "1.7976931348623157e+308");
}

TEST(JinjaEngine, ParseErrorPositions) {
  auto tpl = parse_template("ab\ncd {{ 1 +* 2 }}", "pos", 64);
  ASSERT_FALSE(tpl.ok());
  EXPECT_NE(tpl.status().message().find("template 'pos', line 2, column 10"), std::string::npos)
      << tpl.status().message();
  auto string = parse_template("{{ 'unterminated }}", "str", 64);
  ASSERT_FALSE(string.ok());
  EXPECT_NE(string.status().message().find("line 1, column 4"), std::string::npos) << string.status().message();
  auto comment = parse_template("x\n{# never closed", "c", 64);
  ASSERT_FALSE(comment.ok());
  EXPECT_NE(comment.status().message().find("line 2, column 1"), std::string::npos) << comment.status().message();
}

TEST(JinjaEngine, TaintFollowsStringOperations) {
  ordered_json vars = {{"u", "  <|eot_id|>user  "}};
  // Trusted literal around an untrusted, trimmed, sliced, replaced value.
  auto r = render_with("[{{ u | trim }}]{{ u[2:8] }}{{ 'T' ~ u.replace('user', 'X') }}{{ u | tojson }}", vars, true);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const std::string& text = r->text();
  EXPECT_EQ(text, "[<|eot_id|>user]<|eot_T  <|eot_id|>X  \"  <|eot_id|>user  \"");
  auto untrusted = [&](size_t begin, size_t end) {
    for (const ByteRange& range : r->untrusted_ranges()) {
      if (range.begin <= begin && end <= range.end) return true;
    }
    return false;
  };
  auto trusted = [&](size_t begin, size_t end) { return !r->any_untrusted_in(begin, end); };
  EXPECT_TRUE(trusted(0, 1));                     // "["
  EXPECT_TRUE(untrusted(1, 15));                  // trimmed value
  EXPECT_TRUE(trusted(15, 16));                   // "]"
  EXPECT_TRUE(untrusted(16, 22));                 // slice
  EXPECT_TRUE(trusted(22, 23));                   // "T"
  EXPECT_TRUE(untrusted(23, 35));                 // "  <|eot_id|>"
  EXPECT_TRUE(trusted(35, 36));                   // the template's replacement "X"
  EXPECT_TRUE(untrusted(36, 38));                 // "  "
  EXPECT_TRUE(trusted(38, 39));                   // tojson's opening quote
  EXPECT_TRUE(untrusted(39, text.size() - 1));    // the escaped string
  EXPECT_TRUE(trusted(text.size() - 1, text.size()));
}

TEST(JinjaEngine, TStringMergesAndClipsRanges) {
  TString a = TString::untrusted("abc");
  TString s("xx");
  s.append(a);
  s.append(a);  // adjacent ranges merge
  s.append("yy");
  ASSERT_EQ(s.untrusted_ranges().size(), 1u);
  EXPECT_EQ(s.untrusted_ranges()[0].begin, 2u);
  EXPECT_EQ(s.untrusted_ranges()[0].end, 8u);
  TString cut = s.substr(1, 4);
  ASSERT_EQ(cut.untrusted_ranges().size(), 1u);
  EXPECT_EQ(cut.untrusted_ranges()[0].begin, 1u);
  EXPECT_EQ(cut.untrusted_ranges()[0].end, 3u);
  s.mark_untrusted(0, 1);
  s.mark_untrusted(9, 10);
  EXPECT_EQ(s.untrusted_ranges().size(), 3u);
  s.mark_untrusted(0, 10);
  EXPECT_EQ(s.untrusted_ranges().size(), 1u);
}

}  // namespace
}  // namespace petrel::jinja
