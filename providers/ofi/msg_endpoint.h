// MsgEndpoint: a zsock endpoint over two connected FI_EP_MSG endpoints,
// one for user messages and RMA, one for core's control messages
// (untagged providers cannot keep them apart otherwise), bound to one
// event queue whose FI_SHUTDOWN reports the peer's end. With
// cq_wait=sockets a blocked wait sleeps on the two connections' TCP
// sockets themselves (duplicates found by FindTcpSocket).
#ifndef ZSOCK_PROVIDERS_OFI_MSG_ENDPOINT_H_
#define ZSOCK_PROVIDERS_OFI_MSG_ENDPOINT_H_

#include <rdma/fi_eq.h>

#include <array>
#include <cstdint>

#include "core/fd.h"
#include "providers/ofi/endpoint.h"

namespace zsock::ofi {

class MsgEndpoint final : public OfiEndpoint {
 public:
  // `ep` carries user messages and RMA, `cep` core's control messages;
  // `eq` (wait fd `eq_fd`) reports their connection events. The endpoint
  // joins `cq` in Connected.
  MsgEndpoint(OfiFabric* fabric, OfiCq* cq, fid_ep* ep, fid_ep* cep, fid_eq* eq, int eq_fd,
              fid_cq* fcq, int fcq_fd, EndpointInfo info);
  ~MsgEndpoint() override { CloseAndDetach(); }

  // Both halves are connected: the endpoint learns its addresses and joins
  // its CQ. Fails only when cq_wait=sockets cannot find or duplicate one of
  // its sockets.
  absl::Status Connected();

  absl::Status Send(const void* buf, size_t len, MemoryRegion* mr, uint64_t context) override;
  absl::Status PostRecv(void* buf, size_t len, MemoryRegion* mr, uint64_t context) override;

  bool SocketsMovedLocked() override;
  // Also the event queue, which always has a wait object: libfabric tcp
  // signals its fd for its own progress, and trywait resets it (left
  // signalled, it would keep the wait set readable).
  void AppendTrywaitFidsLocked(bool cq_waits, std::vector<fid*>* fids) override;

 protected:
  int PostControlSend(Request* req) override;
  int PostControlRecv(Request* req) override;
  const char* SendCall() const override { return "fi_send"; }
  const char* RecvCall() const override { return "fi_recv"; }
  void SendFinLocked(std::span<const uint8_t> fin, CompletionList* out) override;
  bool PeerEnded() override;
  void UnwatchConnectionLocked() override;
  void CloseConnectionLocked() override;
  void CloseBindingsLocked() override;

 private:
  absl::Status Inject(const void* buf, size_t len);
  // Names the connection (info_) and, with cq_wait=sockets, finds its sockets.
  absl::Status FindSockets();

  fid_ep* cep_;  // the control connection
  fid_eq* eq_;   // connection events of ep_ and cep_
  int eq_fd_;
  // cq_wait=sockets: duplicates of the TCP sockets of ep_ and cep_
  // (FindTcpSocket), watched in the CQ's wait set.
  std::array<Fd, 2> sockets_;
  std::array<uint64_t, 2> last_consumed_{};  // see SocketsMovedLocked
  bool eq_gone_ = false;  // FI_SHUTDOWN (or an error) seen
};

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_MSG_ENDPOINT_H_
