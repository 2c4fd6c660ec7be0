#include "http/http_request.h"

#include <string>

#include "gtest/gtest.h"

namespace stepwatch::http {
namespace {

HeadParse Parse(const std::string& head, HttpRequest* request) {
  EXPECT_EQ(FindHeadEnd(head), head.size()) << head;
  return ParseRequestHead(head, request);
}

TEST(HttpRequestTest, ParsesRequestLineAndHeaders) {
  HttpRequest r;
  const HeadParse p =
      Parse("GET /metrics?name[]=up HTTP/1.1\r\nHost: x\r\nAuthorization:  Basic abc \r\n\r\n", &r);
  ASSERT_TRUE(p.ok) << p.error;
  EXPECT_EQ(r.method, "GET");
  EXPECT_EQ(r.target, "/metrics?name[]=up");
  EXPECT_EQ(r.path, "/metrics");
  EXPECT_EQ(r.minor_version, 1);
  ASSERT_NE(r.Header("authorization"), nullptr);
  EXPECT_EQ(*r.Header("authorization"), "Basic abc");
  EXPECT_TRUE(r.keep_alive);
}

TEST(HttpRequestTest, KeepAliveFollowsVersionAndConnectionHeader) {
  HttpRequest r;
  ASSERT_TRUE(Parse("GET / HTTP/1.0\r\n\r\n", &r).ok);
  EXPECT_FALSE(r.keep_alive);
  ASSERT_TRUE(Parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", &r).ok);
  EXPECT_TRUE(r.keep_alive);
  ASSERT_TRUE(Parse("GET / HTTP/1.1\r\nHost: x\r\nConnection: te, close\r\n\r\n", &r).ok);
  EXPECT_FALSE(r.keep_alive);
}

TEST(HttpRequestTest, AcceptsBareLineFeedsAndAbsoluteForm) {
  HttpRequest r;
  ASSERT_TRUE(Parse("HEAD http://host:9464/metrics HTTP/1.1\nHost: host\n\n", &r).ok);
  EXPECT_EQ(r.method, "HEAD");
  EXPECT_EQ(r.path, "/metrics");
}

TEST(HttpRequestTest, RejectsAmbiguousOrMalformedHeads) {
  const struct {
    const char* head;
    int status;
  } cases[] = {
      {"GET /metrics\r\n\r\n", 400},                                  // no version
      {"GET  /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 400},             // double space
      {"GET /metrics HTTP/2.0\r\nHost: x\r\n\r\n", 505},              // unsupported version
      {"GET /metrics HTTP/1.1x\r\nHost: x\r\n\r\n", 400},             // garbage version
      {"G(T /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 400},              // method not a token
      {"GET metrics HTTP/1.1\r\nHost: x\r\n\r\n", 400},               // not a path
      {"GET /metrics HTTP/1.1\r\n\r\n", 400},                         // 1.1 without Host
      {"GET /metrics HTTP/1.1\r\nHost : x\r\n\r\n", 400},             // space before colon
      {"GET /metrics HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", 400},   // obsolete folding
      {"GET /metrics HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n", 400},   // no colon
      {"GET /metrics HTTP/1.1\r\nHost: x\r\nA: b\x01\r\n\r\n", 400},  // control character
      {"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n", 400},
      {"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
  };
  for (const auto& c : cases) {
    HttpRequest r;
    const HeadParse p = ParseRequestHead(c.head, &r);
    EXPECT_FALSE(p.ok) << c.head;
    EXPECT_EQ(p.status, c.status) << c.head;
  }
}

TEST(HttpRequestTest, FindsTheEndOfAHeadSplitAcrossReads) {
  const std::string head = "GET / HTTP/1.1\r\nHost: x\r\n\r\nNEXT";
  const size_t end = head.size() - 4;
  // Searching again from where every shorter prefix stopped finds the same end.
  for (size_t cut = 0; cut < head.size(); ++cut) {
    const size_t first = FindHeadEnd(head.substr(0, cut));
    if (first != std::string::npos) {
      EXPECT_EQ(first, end);
      continue;
    }
    EXPECT_EQ(FindHeadEnd(head, cut), end) << cut;
  }
  EXPECT_EQ(FindHeadEnd("GET / HTTP/1.1\r\nHost: x\r\n"), std::string::npos);
  EXPECT_EQ(FindHeadEnd("GET / HTTP/1.0\n\n"), 16u);
}

}  // namespace
}  // namespace stepwatch::http
