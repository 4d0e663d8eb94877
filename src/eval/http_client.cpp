#include "eval/http_client.h"

// clang-format off
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange
#include <boost/asio.hpp>
// clang-format on
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace kvant::eval {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using nlohmann::json;

bool parse_http_url(const std::string& url, HttpTarget& t) {
  std::string u = url;
  if (u.rfind("http://", 0) == 0)
    u = u.substr(7);
  else if (u.find("://") != std::string::npos)
    return false;
  const auto slash = u.find('/');
  const std::string hostport = u.substr(0, slash);
  t.prefix = slash == std::string::npos ? "" : u.substr(slash);
  while (!t.prefix.empty() && t.prefix.back() == '/') t.prefix.pop_back();
  if (t.prefix.ends_with("/v1")) t.prefix.resize(t.prefix.size() - 3);
  const auto colon = hostport.rfind(':');
  t.host = colon == std::string::npos ? hostport : hostport.substr(0, colon);
  t.port = colon == std::string::npos ? "80" : hostport.substr(colon + 1);
  return !t.host.empty();
}

Result<json> http_json(const HttpTarget& t, const std::string& api_key, const std::string& path,
                       const json* body) {
  try {
    asio::io_context ioc;
    asio::ip::tcp::resolver res(ioc);
    asio::ip::tcp::socket sock(ioc);
    asio::connect(sock, res.resolve(t.host, t.port));
    http::request<http::string_body> req{body ? http::verb::post : http::verb::get,
                                         t.prefix + path, 11};
    req.set(http::field::host, t.host);
    if (body) {
      req.set(http::field::content_type, "application/json");
      req.body() = body->dump();
    }
    if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
    req.prepare_payload();
    http::write(sock, req);
    beast::flat_buffer buf;
    http::response_parser<http::string_body> p;
    p.body_limit(boost::none);
    http::read(sock, buf, p);
    const auto& r = p.get();
    if (r.result() != http::status::ok)
      return make_error("server: HTTP " + std::to_string(r.result_int()) + " on " + path + ": " +
                        r.body().substr(0, 300));
    return json::parse(r.body());
  } catch (const std::exception& e) {
    return make_error("server " + t.host + ":" + t.port + ": " + e.what());
  }
}

Result<std::string> first_served_model(const HttpTarget& t, const std::string& api_key) {
  auto m = http_json(t, api_key, "/v1/models", nullptr);
  if (!m) return m.error();
  try {
    return m->at("data").at(0).at("id").get<std::string>();
  } catch (const std::exception&) {
    return make_error("server " + t.host + ":" + t.port + " lists no model at /v1/models");
  }
}

}  // namespace kvant::eval
