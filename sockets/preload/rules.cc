// Parsing and matching the interposer's rules (rules.h).
//
// Hand-written: the format is libsdp's and libvma's, which no Debian
// library parses; it is a handful of whitespace-separated fields.
#include "sockets/preload/rules.h"

#include <arpa/inet.h>
#include <fnmatch.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/status.h"

namespace zsock::preload {
namespace {

constexpr absl::string_view kForm =
    "use zsock|tcp|both server|client|* PROGRAM ADDR[/LEN]:PORTS, e.g. "
    "'use both client * 10.0.0.0/8:5000-5999'";

absl::Status LineError(absl::string_view origin, int line, absl::string_view text,
                       absl::string_view what, absl::string_view fix) {
  return MakeError(absl::StatusCode::kInvalidArgument, 0,
                   absl::StrCat(origin, " line ", line, ": '", text, "': ", what),
                   absl::StrCat(fix, " (the form is: ", kForm, ")"));
}

// "*", "N" or "N-M" into [lo, hi]; false if malformed.
bool ParsePorts(absl::string_view s, uint16_t* lo, uint16_t* hi) {
  if (s == "*") {
    *lo = 0;
    *hi = 65535;
    return true;
  }
  std::pair<absl::string_view, absl::string_view> range = absl::StrSplit(s, absl::MaxSplits('-', 1));
  if (range.second.empty() && s.find('-') == absl::string_view::npos) range.second = range.first;
  uint32_t a, b;
  if (!absl::SimpleAtoi(range.first, &a) || !absl::SimpleAtoi(range.second, &b) || a > 65535 ||
      b > 65535 || a > b) {
    return false;
  }
  *lo = static_cast<uint16_t>(a);
  *hi = static_cast<uint16_t>(b);
  return true;
}

// "ADDR[/LEN]:PORTS" (IPv6 in brackets) into the rule's address fields.
absl::Status ParseEndpoint(absl::string_view s, Rule* r, absl::string_view origin, int line,
                           absl::string_view text) {
  absl::string_view addr, ports;
  if (absl::ConsumePrefix(&s, "[")) {
    size_t close = s.find(']');
    if (close == absl::string_view::npos) {
      return LineError(origin, line, text, "an IPv6 address misses its ']'",
                       "write IPv6 addresses in brackets: [fd00::]/8:80");
    }
    addr = s.substr(0, close);
    s.remove_prefix(close + 1);
    absl::string_view len;
    if (absl::ConsumePrefix(&s, "/")) {
      size_t colon = s.find(':');
      len = s.substr(0, colon);
      s.remove_prefix(colon == absl::string_view::npos ? s.size() : colon);
    }
    if (!absl::ConsumePrefix(&s, ":")) {
      return LineError(origin, line, text, "the address has no ':PORTS'",
                       "end the address with :PORT, :LOW-HIGH or :*");
    }
    ports = s;
    in6_addr a6;
    std::string host(addr);
    if (inet_pton(AF_INET6, host.c_str(), &a6) != 1) {
      return LineError(origin, line, text, absl::StrCat("'", addr, "' is not an IPv6 address"),
                       "write a numeric IPv6 address (names are not resolved)");
    }
    r->family = AF_INET6;
    std::memcpy(r->addr, &a6, 16);
    r->prefix_len = 128;
    if (!len.empty()) {
      int n;
      if (!absl::SimpleAtoi(len, &n) || n < 0 || n > 128) {
        return LineError(origin, line, text, absl::StrCat("prefix length '", len, "'"),
                         "give an IPv6 prefix length from 0 to 128");
      }
      r->prefix_len = n;
    }
  } else {
    size_t colon = s.rfind(':');
    if (colon == absl::string_view::npos) {
      return LineError(origin, line, text, "the address has no ':PORTS'",
                       "end the address with :PORT, :LOW-HIGH or :*");
    }
    addr = s.substr(0, colon);
    ports = s.substr(colon + 1);
    if (addr != "*") {
      std::pair<absl::string_view, absl::string_view> parts =
          absl::StrSplit(addr, absl::MaxSplits('/', 1));
      in_addr a4;
      std::string host(parts.first);
      if (inet_pton(AF_INET, host.c_str(), &a4) != 1) {
        return LineError(origin, line, text,
                         absl::StrCat("'", parts.first, "' is not an IPv4 address"),
                         "write a numeric IPv4 address (names are not resolved), or IPv6 "
                         "in brackets");
      }
      r->family = AF_INET;
      std::memcpy(r->addr, &a4, 4);
      r->prefix_len = 32;
      if (addr.find('/') != absl::string_view::npos) {
        int n;
        if (!absl::SimpleAtoi(parts.second, &n) || n < 0 || n > 32) {
          return LineError(origin, line, text, absl::StrCat("prefix length '", parts.second, "'"),
                           "give an IPv4 prefix length from 0 to 32");
        }
        r->prefix_len = n;
      }
    }
  }
  if (!ParsePorts(ports, &r->port_lo, &r->port_hi)) {
    return LineError(origin, line, text, absl::StrCat("ports '", ports, "'"),
                     "write *, a port (80) or a range (5000-5999), each 0-65535");
  }
  return absl::OkStatus();
}

bool PrefixMatches(const uint8_t* want, const uint8_t* have, int bits) {
  int whole = bits / 8;
  if (std::memcmp(want, have, whole) != 0) return false;
  int rest = bits % 8;
  if (rest == 0) return true;
  uint8_t mask = static_cast<uint8_t>(0xff << (8 - rest));
  return (want[whole] & mask) == (have[whole] & mask);
}

// The address and port of `sa` as the rule compares them. An IPv4-mapped
// IPv6 address compares as IPv4.
bool AddressOf(const sockaddr* sa, int* family, uint8_t addr[16], uint16_t* port) {
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    *family = AF_INET;
    std::memcpy(addr, &in->sin_addr, 4);
    *port = ntohs(in->sin_port);
    return true;
  }
  if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    *port = ntohs(in6->sin6_port);
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      *family = AF_INET;
      std::memcpy(addr, in6->sin6_addr.s6_addr + 12, 4);
    } else {
      *family = AF_INET6;
      std::memcpy(addr, in6->sin6_addr.s6_addr, 16);
    }
    return true;
  }
  return false;
}

}  // namespace

absl::string_view UseName(Use use) {
  switch (use) {
    case Use::kZsock:
      return "zsock";
    case Use::kTcp:
      return "tcp";
    case Use::kBoth:
      return "both";
  }
  return "?";
}

absl::StatusOr<Rules> Rules::Parse(absl::string_view text, absl::string_view origin) {
  Rules out;
  int number = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++number;
    absl::string_view line = raw.substr(0, raw.find('#'));
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (f[0] != "use") {
      return LineError(origin, number, line, absl::StrCat("unknown keyword '", f[0], "'"),
                       "start each rule with 'use'");
    }
    if (f.size() != 5) {
      return LineError(origin, number, line,
                       absl::StrCat("a rule has 5 fields, this line has ", f.size()),
                       "write all four fields after 'use' (use * for any program, address "
                       "or port)");
    }
    Rule r;
    r.line = number;
    r.text = std::string(line);
    if (f[1] == "zsock") {
      r.use = Use::kZsock;
    } else if (f[1] == "tcp") {
      r.use = Use::kTcp;
    } else if (f[1] == "both") {
      r.use = Use::kBoth;
    } else {
      return LineError(origin, number, line, absl::StrCat("'", f[1], "' is not a transport"),
                       "write zsock, tcp or both after 'use'");
    }
    if (f[2] == "server") {
      r.role = Role::kServer;
    } else if (f[2] == "client") {
      r.role = Role::kClient;
    } else if (f[2] == "*") {
      r.role = Role::kAny;
    } else {
      return LineError(origin, number, line, absl::StrCat("'", f[2], "' is not a role"),
                       "write server, client or *");
    }
    r.program = std::string(f[3]);
    if (absl::Status st = ParseEndpoint(f[4], &r, origin, number, line); !st.ok()) return st;
    out.rules_.push_back(std::move(r));
  }
  return out;
}

absl::StatusOr<Rules> Rules::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return ErrnoError(errno, absl::StrCat("cannot read the rules file ", path),
                      "check the path given to --rules or ZSOCK_RULES");
  }
  std::stringstream text;
  text << in.rdbuf();
  return Parse(text.str(), path);
}

Decision Rules::Decide(Role role, absl::string_view program, const sockaddr* addr,
                       bool peer_local) const {
  int family = AF_UNSPEC;
  uint8_t bytes[16] = {};
  uint16_t port = 0;
  const bool have_addr = addr != nullptr && AddressOf(addr, &family, bytes, &port);
  const std::string prog(program);
  for (const Rule& r : rules_) {
    if (r.role != Role::kAny && r.role != role) continue;
    if (r.program != "*" && fnmatch(r.program.c_str(), prog.c_str(), 0) != 0) continue;
    if (r.family != AF_UNSPEC) {
      if (!have_addr || family != r.family || !PrefixMatches(r.addr, bytes, r.prefix_len)) {
        continue;
      }
    }
    if (r.port_lo != 0 || r.port_hi != 65535) {
      if (!have_addr || port < r.port_lo || port > r.port_hi) continue;
    }
    return {r.use, &r};
  }
  return {peer_local ? Use::kBoth : Use::kTcp, nullptr};
}

}  // namespace zsock::preload
