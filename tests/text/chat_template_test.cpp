// SPDX-License-Identifier: Apache-2.0
// Chat templates against renders by jinja2 in transformers' environment (tools/tokenizer/make_goldens.py), and
// the load-time errors for templates outside the supported subset.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fp4serve/error.h"
#include "text/chat_template.h"

#include "tokenizer_fixtures.h"

namespace fp4serve::text {
namespace {

using nlohmann::json;

using test_support::kDir;

using test_support::read_json;

std::vector<ChatMessage> messages_of(const json& list) {
  std::vector<ChatMessage> out;
  for (const auto& m : list) out.push_back({m["role"], m["content"]});
  return out;
}

TEST(ChatTemplateGolden, EveryTemplateAndConversationMatchesJinja2) {
  const json golden = read_json(kDir + "chat_golden.json");
  size_t rendered = 0, raised = 0;
  for (const auto& [name, entry] : golden["templates"].items()) {
    const ChatTemplate tmpl = ChatTemplate::from_file(kDir + entry["file"].get<std::string>());
    for (const auto& c : entry["cases"]) {
      const std::string label = name + "/" + c["conversation"].get<std::string>() +
                                (c["add_generation_prompt"].get<bool>() ? "+gen" : "");
      const auto msgs = messages_of(c["messages"]);
      if (c.contains("expected")) {
        std::string got;
        ASSERT_NO_THROW(got = tmpl.render(msgs, c["add_generation_prompt"], c["extra_context"])) << label;
        EXPECT_EQ(got, c["expected"].get<std::string>()) << label;
        ++rendered;
      } else {
        try {
          tmpl.render(msgs, c["add_generation_prompt"], c["extra_context"]);
          ADD_FAILURE() << label << ": expected the template to raise " << c["error"];
        } catch (const UsageError& e) {
          EXPECT_NE(std::string(e.what()).find(c["error"].get<std::string>()), std::string::npos) << e.what();
          ++raised;
        }
      }
    }
  }
  EXPECT_GE(rendered, 60u);
  EXPECT_GE(raised, 2u);  // mistral rejects non-alternating roles
}

// The templates embedded in the family configs load through from_tokenizer_config and render like the files.
TEST(ChatTemplateGolden, FromTokenizerConfigMatchesGolden) {
  const json golden = read_json(kDir + "chat_golden.json");
  const std::pair<const char*, const char*> configs[] = {
      {"smollm2-real", "smollm2"}, {"llama3", "llama3"}, {"qwen2", "chatml"}, {"mistral", "mistral"},
      {"metaspace", "granite"}};
  for (const auto& [family, name] : configs) {
    const ChatTemplate tmpl = ChatTemplate::from_tokenizer_config(read_json(kDir + family + "/tokenizer_config.json"));
    for (const auto& c : golden["templates"][name]["cases"]) {
      if (!c.contains("expected")) continue;
      EXPECT_EQ(tmpl.render(messages_of(c["messages"]), c["add_generation_prompt"], c["extra_context"]),
                c["expected"].get<std::string>())
          << family << "/" << c["conversation"];
    }
  }
}

TEST(ChatTemplate, MissingTemplateIsUnsupported) {
  EXPECT_THROW(ChatTemplate::from_tokenizer_config(read_json(kDir + "gpt2/tokenizer_config.json")), UnsupportedError);
  EXPECT_THROW(ChatTemplate::from_tokenizer_config(json()), UnsupportedError);
  EXPECT_THROW(ChatTemplate::from_file(kDir + "no-such-template.jinja"), IoError);
}

TEST(ChatTemplate, NamedTemplateListUsesDefault) {
  const json config = {{"chat_template", json::array({{{"name", "tool_use"}, {"template", "T"}},
                                                      {{"name", "default"}, {"template", "D{{ messages|length }}"}}})}};
  EXPECT_EQ(ChatTemplate::from_tokenizer_config(config).render({{"user", "x"}}, false, nullptr), "D1");
}

std::string unsupported_message(const std::string& source) {
  try {
    ChatTemplate::from_string(source, "t");
  } catch (const UnsupportedError& e) {
    return e.what();
  }
  return "(no UnsupportedError)";
}

TEST(ChatTemplate, UnsupportedFeaturesAreNamedAtLoad) {
  EXPECT_NE(unsupported_message("{% filter upper %}x{% endfilter %}").find("filter"), std::string::npos);
  EXPECT_NE(unsupported_message("{% include 'x' %}").find("include"), std::string::npos);
  EXPECT_NE(unsupported_message("a\n{{ x | wordwrap }}").find("filter 'wordwrap'"), std::string::npos);
  EXPECT_NE(unsupported_message("a\n{{ x | wordwrap }}").find("line 2"), std::string::npos);
  EXPECT_NE(unsupported_message("{% if x is escaped %}{% endif %}").find("test 'is escaped'"), std::string::npos);
  // A call of a name that is neither a global function nor a macro of the template.
  EXPECT_NE(unsupported_message("{% macro m() %}{% endmacro %}{{ n() }}").find("function n()"), std::string::npos);
  EXPECT_NE(unsupported_message("{{ lipsum() }}").find("function lipsum()"), std::string::npos);
  EXPECT_NE(unsupported_message("{{ s.zfill(3) }}").find("method .zfill()"), std::string::npos);
  EXPECT_NE(unsupported_message("{% for x in y recursive %}{% endfor %}").find("recursive"), std::string::npos);
}

TEST(ChatTemplate, SyntaxErrorsAreFormatErrors) {
  for (const char* bad : {"{% if x %}no end", "{{ 'unterminated }}", "{% for in x %}{% endfor %}", "{{ (1 }}",
                          "{% endif %}", "{{ x y }}", "{# open comment", "{% set %}"}) {
    EXPECT_THROW(ChatTemplate::from_string(bad), FormatError) << bad;
  }
}

TEST(ChatTemplate, RenderErrorsAreUsageErrors) {
  EXPECT_THROW(ChatTemplate::from_string("{{ nothing.attr }}").render({}, false, nullptr), UsageError);
  EXPECT_THROW(ChatTemplate::from_string("{{ 'a' + 1 }}").render({}, false, nullptr), UsageError);
  EXPECT_THROW(ChatTemplate::from_string("{{ 1 // 0 }}").render({}, false, nullptr), UsageError);
  EXPECT_THROW(ChatTemplate::from_string("{% set x.a = 1 %}").render({}, false, {{"x", 1}}), UsageError);
  EXPECT_THROW(ChatTemplate::from_string("x").render({}, false, json::array()), UsageError);
  // An undefined value prints as nothing and is falsy, as in jinja2's default Undefined.
  EXPECT_EQ(ChatTemplate::from_string("[{{ nothing }}]{% if not nothing %}f{% endif %}").render({}, false, nullptr),
            "[]f");
}

}  // namespace
}  // namespace fp4serve::text
