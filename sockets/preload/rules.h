// The interposer's rules: which kernel TCP connections zsock may accelerate.
//
// A rules file in the style of libsdp.conf and libvma.conf, one rule per
// line, '#' to the end of a line is a comment:
//
//   use zsock|tcp|both  server|client|*  PROGRAM  ADDR[/LEN]:PORTS
//
//   zsock    accelerate; if the peer cannot be reached over the provider,
//            the connection fails as a kernel connect would
//   tcp      leave the connection on kernel TCP
//   both     accelerate when the peer agrees, otherwise stay on kernel TCP
//   server   connections a program accepts (ADDR:PORTS is the local,
//            listening address); client: connections it opens (ADDR:PORTS
//            is the peer's address); *: either
//   PROGRAM  a shell glob on the program's name (basename of argv[0]), or *
//   ADDR     *, an IPv4 or IPv6 address, with an optional prefix length
//            (10.0.0.0/8, [fd00::]/8: IPv6 in brackets); PORTS: *, N or N-M
//
// The first rule that matches decides. With no matching rule (or no file)
// the default applies: peers on this host are accelerated ("both", the
// same-host shortcut), others stay on kernel TCP.
#ifndef ZSOCK_SOCKETS_PRELOAD_RULES_H_
#define ZSOCK_SOCKETS_PRELOAD_RULES_H_

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zsock::preload {

enum class Use { kZsock, kTcp, kBoth };
enum class Role { kServer, kClient, kAny };

absl::string_view UseName(Use use);

struct Rule {
  Use use = Use::kBoth;
  Role role = Role::kAny;
  std::string program;      // glob; "*" matches every program
  int family = AF_UNSPEC;   // AF_UNSPEC: any address
  uint8_t addr[16] = {};    // network byte order; IPv4 in the first 4 bytes
  int prefix_len = 0;       // bits of addr that must match
  uint16_t port_lo = 0;
  uint16_t port_hi = 65535;
  int line = 0;             // where it came from, for zsock_info and logs
  std::string text;         // the line as written
};

// What decided a connection: the rule, or the default.
struct Decision {
  Use use = Use::kBoth;
  const Rule* rule = nullptr;  // nullptr: the default
};

class Rules {
 public:
  // Parses rules text. `origin` names it in errors ("/etc/zsock/rules.conf").
  // An error names the line, what is wrong and how to write it instead.
  static absl::StatusOr<Rules> Parse(absl::string_view text, absl::string_view origin);
  // Reads and parses a file; a missing file is an error that says so.
  static absl::StatusOr<Rules> Load(const std::string& path);

  // The first rule matching a connection of `program` in `role` (kServer or
  // kClient) whose rule address is `addr` (the peer's for a client, the
  // local listening address for a server), else the default: kBoth when
  // the peer is on this host (`peer_local`), else kTcp.
  Decision Decide(Role role, absl::string_view program, const sockaddr* addr,
                  bool peer_local) const;

  const std::vector<Rule>& rules() const { return rules_; }

 private:
  std::vector<Rule> rules_;
};

}  // namespace zsock::preload

#endif  // ZSOCK_SOCKETS_PRELOAD_RULES_H_
