// The chat-specific parts of a request (openai_api.h): messages as the
// template sees them, tools and tool_choice, template switches, and the
// structured-output fields (response_format; structured_outputs and the
// guided_* fields as extensions). Each returns the client's error, naming
// the field, or nothing.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>

#include "server/openai_api.h"

namespace kvant::server {

std::optional<ApiError> read_chat_messages(const nlohmann::ordered_json& body, ParsedRequest& r);
// tools, tool_choice, parallel_tool_calls, chat_template_kwargs.
std::optional<ApiError> read_tools(const nlohmann::ordered_json& body, ParsedRequest& r);
// response_format, structured_outputs, guided_json, guided_regex, guided_choice.
std::optional<ApiError> read_output_format(const nlohmann::ordered_json& body, ParsedRequest& r);

}  // namespace kvant::server
