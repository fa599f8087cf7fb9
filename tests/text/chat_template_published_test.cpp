// SPDX-License-Identifier: Apache-2.0
// The published chat templates of every architecture fp4serve lists (tests/data/tokenizers/published/, sources
// in its README.md) against transformers' own renderer (tools/tokenizer/make_template_goldens.py): byte-for-byte
// equal text, or an error where transformers raises one, over system / multi-turn / tool-call / reasoning /
// content-part / document conversations, with the generation prompt on and off, and chat_template_kwargs.
#include <gtest/gtest.h>

#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fp4serve/error.h"
#include "text/chat_template.h"
#include "text/tokenizer_fixtures.h"

namespace fp4serve::text {
namespace {

using ojson = nlohmann::ordered_json;

const std::string kPublishedDir = std::string(FP4SERVE_TEST_DATA) + "/tokenizers/published/";

using test_support::read_ordered;

// The variables transformers' apply_chat_template passes: special tokens, tools, documents, then the kwargs.
ojson variables_of(const ojson& c) {
  ojson v = c["special_tokens"];
  for (const char* key : {"tools", "documents"}) {
    if (c.contains(key)) v[key] = c[key];
  }
  for (const auto& [k, x] : c["chat_template_kwargs"].items()) v[k] = x;
  return v;
}

TEST(ChatTemplatePublished, EveryTemplateConversationAndKwargsMatchesTransformers) {
  const ojson golden = read_ordered(kPublishedDir + "golden.json");
  const int64_t now = golden["now_unix"].get<int64_t>();
  std::map<std::string, ChatTemplate> templates;
  // template → conversation → "=" (equal) / "raises" (both raise) / "DIFF"
  std::map<std::string, std::map<std::string, std::string>> table;
  size_t equal = 0, raised = 0;
  for (const auto& c : golden["cases"]) {
    const std::string file = c["template"].get<std::string>();
    if (!templates.count(file)) templates.emplace(file, ChatTemplate::from_file(kPublishedDir + file));
    const ChatTemplate& tmpl = templates.at(file);
    const bool agp = c["add_generation_prompt"].get<bool>();
    const std::string conversation = c["conversation"].get<std::string>();
    const std::string label = file + " / " + conversation + (agp ? " +generation prompt" : "");
    // The kwargs runs (e.g. "reasoning+kwargs0") share one column.
    const std::string column = conversation.find("+kwargs") == std::string::npos ? conversation : "with kwargs";
    std::string& cell = table[file][column];
    if (c.contains("text")) {
      std::string got;
      try {
        got = tmpl.render_messages(c["messages"], agp, variables_of(c), now);
      } catch (const Error& e) {
        ADD_FAILURE() << label << ": " << e.what();
        cell = "DIFF";
        continue;
      }
      EXPECT_EQ(got, c["text"].get<std::string>()) << label;
      if (got == c["text"].get<std::string>()) {
        ++equal;
        if (cell.empty()) cell = "=";
      } else {
        cell = "DIFF";
      }
    } else {
      const std::string expected = c["error"].get<std::string>();
      try {
        tmpl.render_messages(c["messages"], agp, variables_of(c), now);
        ADD_FAILURE() << label << ": transformers raises " << expected << " but fp4serve rendered";
        cell = "DIFF";
      } catch (const UsageError& e) {
        // raise_exception's text is the template's own: it must come through unchanged.
        const std::string prefix = "TemplateError: ";
        if (expected.rfind(prefix, 0) == 0) {
          EXPECT_NE(std::string(e.what()).find(expected.substr(prefix.size())), std::string::npos) << e.what();
        }
        ++raised;
        if (cell.empty() || cell == "=") cell = cell.empty() ? "raises" : "= / raises";
      }
    }
  }
  EXPECT_EQ(equal + raised, golden["cases"].size());
  EXPECT_GE(templates.size(), 14u);
  EXPECT_GE(equal, 200u);
  // The table of the issue note: one row per template, one column per conversation.
  std::map<std::string, int> columns;
  for (const auto& [file, row] : table) {
    for (const auto& [conv, _] : row) columns[conv] = 0;
  }
  std::cout << "| template |";
  for (const auto& [conv, _] : columns) std::cout << ' ' << conv << " |";
  std::cout << "\n|---|";
  for (size_t k = 0; k < columns.size(); ++k) std::cout << "---|";
  std::cout << '\n';
  for (const auto& [file, row] : table) {
    std::cout << "| " << file << " |";
    for (const auto& [conv, _] : columns) std::cout << ' ' << (row.count(conv) ? row.at(conv) : "–") << " |";
    std::cout << '\n';
  }
}

}  // namespace
}  // namespace fp4serve::text
