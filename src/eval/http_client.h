// A small blocking HTTP/1.1 client for the commands that talk to a running
// server (`kvant eval --url`, `kvant bench serve`): URL parsing and one JSON
// request per connection. Streaming reads stay with their command.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "core/result.h"

namespace kvant::eval {

struct HttpTarget {
  std::string host, port, prefix;  // prefix: a path before /v1, "" usually
};

// "http://HOST[:PORT][/PREFIX][/v1][/]" (port 80 when absent). False for
// another scheme or no host.
bool parse_http_url(const std::string& url, HttpTarget& t);

// One request on a fresh connection, with `body` as JSON (none when null, a
// GET then). The parsed body of a 200 response; otherwise an error naming
// the status, the path and the start of the body.
Result<nlohmann::json> http_json(const HttpTarget& t, const std::string& api_key,
                                 const std::string& path, const nlohmann::json* body);

// The id of the first model that /v1/models lists.
Result<std::string> first_served_model(const HttpTarget& t, const std::string& api_key);

}  // namespace kvant::eval
