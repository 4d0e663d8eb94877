// libFuzzer target for what a client controls before a request reaches the
// engine: the HTTP request (Beast's parser, with the server's header and
// body limits), the header checks (Host, Origin, Content-Type, API key) and
// the OpenAI request parser on its body, for both endpoints. Any crash,
// sanitizer report or exception escaping the parser is a finding.
// clang-format off
#include <utility>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
// clang-format on
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "server/admission.h"
#include "server/openai_api.h"

namespace http = boost::beast::http;
using namespace kvant::server;

namespace {
std::string_view sv(boost::beast::string_view v) { return {v.data(), v.size()}; }
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  // The raw bytes as a body too: most findings are in the JSON side.
  (void)parse_request(Endpoint::Chat, in, "m", 64);
  (void)parse_request(Endpoint::Completion, in, "m", 64);

  http::request_parser<http::string_body> parser;
  parser.header_limit(64 * 1024);
  parser.body_limit(1 << 20);
  parser.eager(true);
  boost::beast::error_code ec;
  parser.put(boost::asio::buffer(in.data(), in.size()), ec);
  if (ec || !parser.is_header_done()) return 0;
  const auto& h = parser.get();
  OriginPolicy p;
  (void)check_host(p, sv(h[http::field::host]));
  if (auto it = h.find(http::field::origin); it != h.end()) (void)check_origin(p, sv(it->value()));
  (void)is_json_content_type(sv(h[http::field::content_type]));
  if (auto it = h.find(http::field::authorization); it != h.end())
    (void)bearer_matches(sv(it->value()), "sk-test");
  if (!parser.is_done()) return 0;
  const std::string& body = parser.get().body();
  (void)parse_request(Endpoint::Chat, body, "m", 64);
  (void)parse_request(Endpoint::Completion, body, "m", 64);
  return 0;
}
