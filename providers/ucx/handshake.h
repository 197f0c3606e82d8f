// Connection set-up (UcxFabric::Handshake, handshake.cc), run alike by
// both sides on the TCP socket from Connect or Accept:
//
// 1. Hello frames: worker addresses, endpoint ids and secrets (the tags),
//    flow windows, the shared-memory probe and boot id, the key tables.
// 2. Each side creates its UCX endpoint over the primary transports, when
//    the peer is on this host and its shared memory can be attached (if
//    the transports need that), and sends its verdict.
// 3. If either side failed and both accept it (fallback=tcp), both switch
//    to their tcp-only worker and exchange its address (Fallback frames).
// 4. The endpoint's notes name the lanes UCX chose; over shared memory
//    with atomics, the peer's key table is mapped for native RMA.
//
// UCP's own sockaddr listener is not used: its connection manager runs on
// UCX's async thread, so it hangs in forked children, and in UCX 1.13 it
// cannot connect shared-memory-only contexts at all. The socket stays open
// afterwards as the connection's liveness signal (endpoint.h).
#ifndef ZSOCK_PROVIDERS_UCX_HANDSHAKE_H_
#define ZSOCK_PROVIDERS_UCX_HANDSHAKE_H_

#include <string>
#include <vector>

namespace zsock::ucx {

// Parsed from ucp_ep_print_info: "lane[1]:  0:posix/memory.0 md[0] -> ... amo#0 am".
struct Lane {
  std::string transport;  // "posix/memory", "tcp/lo"
  std::vector<std::string> uses;
};
std::vector<Lane> ParseLanes(const std::string& text);

}  // namespace zsock::ucx

#endif  // ZSOCK_PROVIDERS_UCX_HANDSHAKE_H_
