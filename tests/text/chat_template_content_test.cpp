// SPDX-License-Identifier: Apache-2.0
// Content format detection (vLLM's "string" vs "openai") and text parts rendered through both kinds of template
// (issue 43 item 1: a list of text parts failed with `str + list` in templates that concatenate content).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "fp4serve/error.h"
#include "text/chat_template.h"

namespace fp4serve::text {
namespace {

using ojson = nlohmann::ordered_json;

const std::string kContentPublishedDir = std::string(FP4SERVE_TEST_DATA) + "/tokenizers/published/";

// Concatenates content as a string, like most published templates.
constexpr const char* kStringTemplate =
    "{% for m in messages %}<{{ m['role'] }}>{{ m['role'] + ': ' + m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}";
// Iterates content as OpenAI's list of parts (Llama 3.2 Vision, Gemma 3, Granite 4 style), through a derived list.
constexpr const char* kListTemplate =
    // Under the openai format every content is a list (vLLM wraps strings too), so the system text is a part.
    "{% set loop_messages = messages[1:] %}{% set system = messages[0]['content'] %}"
    "{{ system if system is string else system[0]['text'] }}|"
    "{% for message in loop_messages %}<{{ message.role }}>"
    "{% if message.content is string %}{{ message.content }}"
    "{% else %}{% for part in message.content | selectattr('type', 'equalto', 'text') %}[{{ part.text }}]{% endfor %}"
    "{% endif %}{% endfor %}";

ojson parts_conversation() {
  return ojson::parse(R"([{"role": "system", "content": "S"},
                          {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}])");
}

TEST(ChatTemplateContent, DetectsStringAndOpenAiTemplates) {
  EXPECT_EQ(ChatTemplate::from_string(kStringTemplate).content_format(), ContentFormat::kString);
  EXPECT_EQ(ChatTemplate::from_string(kListTemplate).content_format(), ContentFormat::kOpenAI);
  // A loop over something that is not a message's content does not count.
  EXPECT_EQ(ChatTemplate::from_string("{% for t in tools %}{% for p in t['content'] %}{{ p }}{% endfor %}{% endfor %}"
                                      "{% for m in messages %}{{ m.content }}{% endfor %}")
                .content_format(),
            ContentFormat::kString);
  // Inside a macro, over messages | reverse, with message['content'] spelled as an item.
  EXPECT_EQ(ChatTemplate::from_string("{% macro f(x) %}{% for m in messages | reverse %}{% for c in m['content'] %}"
                                      "{{ c.text }}{% endfor %}{% endfor %}{% endmacro %}{{ f(1) }}")
                .content_format(),
            ContentFormat::kOpenAI);
  EXPECT_STREQ(content_format_name(ContentFormat::kString), "string");
  EXPECT_STREQ(content_format_name(ContentFormat::kOpenAI), "openai");
}

TEST(ChatTemplateContent, PublishedTemplatesDetectAsVllmDoes) {
  // Granite 4.0 iterates `message.content` (its entries' text joined by the template); the others concatenate.
  size_t seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kContentPublishedDir)) {
    if (entry.path().extension() != ".jinja") continue;
    const ChatTemplate t = ChatTemplate::from_file(entry.path());
    const bool granite4 = entry.path().filename() == "ibm-granite-granite-4.0.jinja";
    EXPECT_EQ(t.content_format(), granite4 ? ContentFormat::kOpenAI : ContentFormat::kString) << entry.path();
    ++seen;
  }
  EXPECT_GE(seen, 13u);
}

TEST(ChatTemplateContent, TextPartsRenderWithBothKindsOfTemplate) {
  const ojson parts = parts_conversation();
  // String template: the raw list fails as before (str + list); joined it renders like the string content.
  const ChatTemplate str = ChatTemplate::from_string(kStringTemplate);
  EXPECT_THROW(str.render_messages(parts, true, ojson::object()), UsageError);
  ojson as_string = parts;
  as_string[1]["content"] = "Hi\nthere";
  EXPECT_EQ(str.render_messages(apply_content_format(parts, str.content_format()), true, ojson::object()),
            str.render_messages(as_string, true, ojson::object()));
  EXPECT_EQ(str.render_messages(as_string, true, ojson::object()), "<system>system: S\n<user>user: Hi\nthere\n<assistant>");
  // List template: the parts reach it as a list.
  const ChatTemplate list = ChatTemplate::from_string(kListTemplate);
  EXPECT_EQ(list.render_messages(apply_content_format(parts, list.content_format()), true, ojson::object()),
            "S|<user>[Hi][there]");
  // Forcing "string" on the list template still renders (its `is string` branch).
  EXPECT_EQ(list.render_messages(apply_content_format(parts, ContentFormat::kString), true, ojson::object()),
            "S|<user>Hi\nthere");
}

TEST(ChatTemplateContent, NonTextPartsAreRefusedNamingTheirType) {
  for (const char* type : {"image_url", "input_audio", "file"}) {
    ojson m = ojson::parse(R"([{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "x"}]}])");
    m[0]["content"][1]["type"] = type;
    for (const ContentFormat f : {ContentFormat::kString, ContentFormat::kOpenAI}) {
      try {
        apply_content_format(m, f);
        ADD_FAILURE() << type;
      } catch (const UnsupportedError& e) {
        EXPECT_NE(std::string(e.what()).find(std::string("'") + type + "'"), std::string::npos) << e.what();
      }
    }
  }
  EXPECT_THROW(apply_content_format(ojson::parse(R"([{"role": "user", "content": [{"type": "text"}]}])"),
                                    ContentFormat::kString), UnsupportedError);
  EXPECT_THROW(apply_content_format(ojson::parse(R"([{"role": "user", "content": ["hi"]}])"), ContentFormat::kOpenAI),
               UnsupportedError);
}

// As vLLM shapes content (_parse_chat_message_content): a string is one text part and null is none; "openai"
// templates get {type, text} parts rebuilt (extra keys dropped), "string" templates the texts joined with "\n".
TEST(ChatTemplateContent, StringsAndNullTakeTheTemplatesShape) {
  const ojson m = ojson::parse(R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": null},
    {"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {}}, {"type": "text", "text": "b"}]},
    {"role": "tool"}])");
  EXPECT_EQ(apply_content_format(m, ContentFormat::kOpenAI), ojson::parse(R"([
    {"role": "user", "content": [{"type": "text", "text": "hi"}]}, {"role": "assistant", "content": []},
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}, {"role": "tool"}])"));
  EXPECT_EQ(apply_content_format(m, ContentFormat::kString), ojson::parse(R"([
    {"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}, {"role": "user", "content": "a\nb"},
    {"role": "tool"}])"));
}

}  // namespace
}  // namespace fp4serve::text
