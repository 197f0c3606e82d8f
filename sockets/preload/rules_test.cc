#include "sockets/preload/rules.h"

#include <arpa/inet.h>

#include <string>

#include "gtest/gtest.h"

namespace zsock::preload {
namespace {

sockaddr_storage V4(const char* ip, uint16_t port) {
  sockaddr_storage ss{};
  auto* in = reinterpret_cast<sockaddr_in*>(&ss);
  in->sin_family = AF_INET;
  in->sin_port = htons(port);
  EXPECT_EQ(inet_pton(AF_INET, ip, &in->sin_addr), 1) << ip;
  return ss;
}

sockaddr_storage V6(const char* ip, uint16_t port) {
  sockaddr_storage ss{};
  auto* in6 = reinterpret_cast<sockaddr_in6*>(&ss);
  in6->sin6_family = AF_INET6;
  in6->sin6_port = htons(port);
  EXPECT_EQ(inet_pton(AF_INET6, ip, &in6->sin6_addr), 1) << ip;
  return ss;
}

const sockaddr* Sa(const sockaddr_storage& ss) { return reinterpret_cast<const sockaddr*>(&ss); }

TEST(Rules, FirstMatchWinsWithCommentsAndBlankLines) {
  auto rules = Rules::Parse(R"(
# redis on the cluster network goes over zsock, nothing else of it
use zsock client redis-* 10.1.0.0/16:6379
use tcp   *      redis-* *:*     # the rest of redis stays on TCP

use both  server nginx   *:80-81
)", "test.conf");
  ASSERT_TRUE(rules.ok()) << rules.status();
  ASSERT_EQ(rules->rules().size(), 3u);
  EXPECT_EQ(rules->rules()[1].line, 4);

  auto d = rules->Decide(Role::kClient, "redis-benchmark", Sa(V4("10.1.2.3", 6379)), false);
  EXPECT_EQ(d.use, Use::kZsock);
  ASSERT_NE(d.rule, nullptr);
  EXPECT_EQ(d.rule->line, 3);
  // Same program, other port or network: the second rule.
  EXPECT_EQ(rules->Decide(Role::kClient, "redis-benchmark", Sa(V4("10.1.2.3", 6380)), false).use,
            Use::kTcp);
  EXPECT_EQ(rules->Decide(Role::kClient, "redis-cli", Sa(V4("10.2.0.1", 6379)), true).use,
            Use::kTcp);
  // The server rule: a role, a program and a port range.
  EXPECT_EQ(rules->Decide(Role::kServer, "nginx", Sa(V4("0.0.0.0", 81)), false).use, Use::kBoth);
  EXPECT_EQ(rules->Decide(Role::kClient, "nginx", Sa(V4("1.2.3.4", 80)), false).rule, nullptr);
}

TEST(Rules, DefaultAcceleratesOnlyPeersOnThisHost) {
  auto rules = Rules::Parse("", "empty");
  ASSERT_TRUE(rules.ok());
  auto local = rules->Decide(Role::kClient, "iperf3", Sa(V4("127.0.0.1", 5201)), true);
  EXPECT_EQ(local.use, Use::kBoth);
  EXPECT_EQ(local.rule, nullptr);
  EXPECT_EQ(rules->Decide(Role::kClient, "iperf3", Sa(V4("192.0.2.1", 5201)), false).use,
            Use::kTcp);
}

TEST(Rules, PrefixLengthsAreBitExact) {
  auto rules = Rules::Parse("use zsock * * 192.168.4.0/23:*\nuse zsock * * 10.0.0.7:*", "t");
  ASSERT_TRUE(rules.ok()) << rules.status();
  EXPECT_EQ(rules->Decide(Role::kClient, "p", Sa(V4("192.168.5.255", 1)), false).use, Use::kZsock);
  EXPECT_EQ(rules->Decide(Role::kClient, "p", Sa(V4("192.168.6.0", 1)), false).use, Use::kTcp);
  EXPECT_EQ(rules->Decide(Role::kClient, "p", Sa(V4("10.0.0.7", 1)), false).use, Use::kZsock);
  EXPECT_EQ(rules->Decide(Role::kClient, "p", Sa(V4("10.0.0.8", 1)), false).use, Use::kTcp);
}

TEST(Rules, Ipv6AndMappedIpv4) {
  auto rules = Rules::Parse("use zsock client * [fd00::]/8:9000\nuse both * * 10.0.0.0/8:*", "t");
  ASSERT_TRUE(rules.ok()) << rules.status();
  EXPECT_EQ(rules->Decide(Role::kClient, "p", Sa(V6("fd12::1", 9000)), false).use, Use::kZsock);
  EXPECT_EQ(rules->Decide(Role::kClient, "p", Sa(V6("fe80::1", 9000)), false).use, Use::kTcp);
  // An IPv4-mapped IPv6 peer matches the IPv4 rule.
  EXPECT_EQ(rules->Decide(Role::kClient, "p", Sa(V6("::ffff:10.9.8.7", 1)), false).use,
            Use::kBoth);
}

// Every malformed rule is refused with its line, what is wrong, and a fix.
TEST(Rules, ErrorsNameTheLineAndTheFix) {
  struct Case {
    const char* text;
    const char* expect;
  } cases[] = {
      {"use zsock client *", "a rule has 5 fields, this line has 4"},
      {"usr zsock client * *:*", "unknown keyword 'usr'"},
      {"use rdma client * *:*", "'rdma' is not a transport"},
      {"use zsock clients * *:*", "'clients' is not a role"},
      {"use zsock client * 10.0.0.1", "the address has no ':PORTS'"},
      {"use zsock client * 10.0.0.300:80", "'10.0.0.300' is not an IPv4 address"},
      {"use zsock client * 10.0.0.0/33:80", "prefix length '33'"},
      {"use zsock client * *:70000", "ports '70000'"},
      {"use zsock client * *:90-80", "ports '90-80'"},
      {"use zsock client * [fd00::/8:80", "misses its ']'"},
      {"use zsock client * [fd00::]/129:80", "prefix length '129'"},
      {"use zsock client * host.example:80", "'host.example' is not an IPv4 address"},
  };
  for (const Case& c : cases) {
    auto rules = Rules::Parse(std::string("# first line\n") + c.text, "/etc/zsock/rules.conf");
    ASSERT_FALSE(rules.ok()) << c.text;
    const std::string msg(rules.status().message());
    EXPECT_NE(msg.find("/etc/zsock/rules.conf line 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
    EXPECT_NE(msg.find("fix:"), std::string::npos) << msg;
    EXPECT_EQ(rules.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(Rules, MissingFileSaysSo) {
  auto rules = Rules::Load("/nonexistent/zsock-rules.conf");
  ASSERT_FALSE(rules.ok());
  EXPECT_NE(rules.status().message().find("/nonexistent/zsock-rules.conf"), std::string::npos);
}

}  // namespace
}  // namespace zsock::preload
