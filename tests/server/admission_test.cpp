// The server's admission rules (server/admission.h), without sockets.
#include "server/admission.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

namespace kvant::server {
namespace {

TEST(ByteBudget, AdmitsUpToItsLimitAndGivesBack) {
  ByteBudget b(100);
  EXPECT_TRUE(b.try_reserve(60));
  EXPECT_FALSE(b.try_reserve(41));
  EXPECT_TRUE(b.try_reserve(40));
  EXPECT_EQ(b.used(), 100);
  b.release(60);
  EXPECT_EQ(b.used(), 40);
}

TEST(ByteBudget, ReservationsResizeAndReleaseOnScopeExit) {
  ByteBudget b(100);
  {
    Reservation r(&b);
    EXPECT_TRUE(r.resize(70));
    EXPECT_FALSE(r.resize(120));  // unchanged on failure
    EXPECT_EQ(r.bytes(), 70);
    EXPECT_TRUE(r.resize(10));
    EXPECT_EQ(b.used(), 10);
    Reservation moved = std::move(r);
    EXPECT_EQ(r.bytes(), 0);
    EXPECT_EQ(moved.bytes(), 10);
    EXPECT_EQ(b.used(), 10);
  }
  EXPECT_EQ(b.used(), 0);
}

TEST(ConnectionLimits, CountsTotalAndPerAddress) {
  ConnectionLimits l(3, 2);
  using V = ConnectionLimits::Verdict;
  EXPECT_EQ(l.admit("a"), V::kAccept);
  EXPECT_EQ(l.admit("a"), V::kAccept);
  EXPECT_EQ(l.admit("a"), V::kOverAddress);
  EXPECT_EQ(l.open(), 3);
  l.release("a");
  EXPECT_EQ(l.admit("b"), V::kAccept);
  EXPECT_EQ(l.admit("c"), V::kOverTotal);
  l.release("c");
  l.release("b");
  l.release("a");
  l.release("a");
  EXPECT_EQ(l.open(), 0);
  l.release("never");  // unknown addresses are ignored
  EXPECT_EQ(l.open(), 0);
}

TEST(OriginPolicy, LoopbackBindAnswersLoopbackNamesOnly) {
  OriginPolicy p;
  for (const char* h : {"127.0.0.1", "127.0.0.1:8080", "localhost:8080", "LOCALHOST", "[::1]:80",
                        "127.1.2.3", "app.localhost:1"})
    EXPECT_FALSE(check_host(p, h)) << h;
  for (const char* h : {"evil.example", "evil.example:8080", "127.0.0.1.evil.example", "",
                        "10.0.0.1", "[::2]"})
    EXPECT_TRUE(check_host(p, h)) << h;
  p.allowed_hosts = {"api.example"};
  EXPECT_FALSE(check_host(p, "api.example:443"));
  EXPECT_TRUE(check_host(p, "localhost"));  // the list replaces the loopback default
  p.allowed_hosts = {"*"};
  EXPECT_FALSE(check_host(p, "anything"));
  OriginPolicy open;
  open.loopback_bind = false;
  EXPECT_FALSE(check_host(open, "evil.example"));
}

TEST(OriginPolicy, OriginsFromOtherSitesAreRefused) {
  OriginPolicy p;
  EXPECT_FALSE(check_origin(p, "http://localhost:3000"));
  EXPECT_FALSE(check_origin(p, "http://127.0.0.1:8080"));
  EXPECT_TRUE(check_origin(p, "http://evil.example"));
  EXPECT_TRUE(check_origin(p, "null"));
  EXPECT_TRUE(check_origin(p, "garbage"));
  p.allowed_origins = {"https://ui.example"};
  EXPECT_FALSE(check_origin(p, "https://UI.example"));
  EXPECT_TRUE(origin_listed(p, "https://ui.example"));
  EXPECT_TRUE(check_origin(p, "http://ui.example"));
}

TEST(Admission, JsonContentType) {
  EXPECT_TRUE(is_json_content_type("application/json"));
  EXPECT_TRUE(is_json_content_type("Application/JSON; charset=utf-8"));
  EXPECT_FALSE(is_json_content_type("text/plain"));
  EXPECT_FALSE(is_json_content_type("application/x-www-form-urlencoded"));
  EXPECT_FALSE(is_json_content_type(""));
}

TEST(Admission, BearerKeys) {
  EXPECT_TRUE(bearer_matches("Bearer sk-1", "sk-1"));
  EXPECT_TRUE(bearer_matches("bearer sk-1", "sk-1"));
  EXPECT_TRUE(bearer_matches("BEARER  sk-1 ", "sk-1"));
  EXPECT_FALSE(bearer_matches("Bearer sk-2", "sk-1"));
  EXPECT_FALSE(bearer_matches("Bearer sk-1x", "sk-1"));
  EXPECT_FALSE(bearer_matches("Bearer sk-", "sk-1"));
  EXPECT_FALSE(bearer_matches("Basic sk-1", "sk-1"));
  EXPECT_FALSE(bearer_matches("sk-1", "sk-1"));
  EXPECT_FALSE(bearer_matches("Bearer ", ""));
}

TEST(Admission, ApiKeyFromFlagFileOrEnvironment) {
  const std::string path = ::testing::TempDir() + "kvant_key_test.txt";
  {
    std::ofstream f(path);
    f << "  sk-file \nsecond line\n";
  }
  ::unsetenv("KVANT_API_KEY");
  EXPECT_EQ(resolve_api_key("sk-flag", path).value(), "sk-flag");
  EXPECT_EQ(resolve_api_key("", path).value(), "sk-file");
  EXPECT_FALSE(resolve_api_key("", path + ".missing").ok());
  ::setenv("KVANT_API_KEY", "sk-env", 1);
  EXPECT_EQ(resolve_api_key("", "").value(), "sk-env");
  ::unsetenv("KVANT_API_KEY");
  EXPECT_EQ(resolve_api_key("", "").value(), "");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kvant::server
