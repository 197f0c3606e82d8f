// RdmEndpoint: a zsock endpoint over one FI_EP_RDM endpoint that reaches
// its one peer through an address vector. User and control messages go by
// the tagged interface with different tags, so a user message waiting for
// a posted receive never blocks control traffic. The TCP socket the peers
// bootstrapped over (rdm_connect.cc) stays open: its end is the liveness
// signal, and it carries the graceful close's FIN.
#ifndef ZSOCK_PROVIDERS_OFI_RDM_ENDPOINT_H_
#define ZSOCK_PROVIDERS_OFI_RDM_ENDPOINT_H_

#include <rdma/fi_domain.h>

#include <string>
#include <utility>

#include "core/fd.h"
#include "providers/ofi/endpoint.h"

namespace zsock::ofi {

class RdmEndpoint final : public OfiEndpoint {
 public:
  // `ep` reaches `peer` through `av`; `oob` is the bootstrap socket. The
  // endpoint joins `cq` at once.
  RdmEndpoint(OfiFabric* fabric, OfiCq* cq, fid_ep* ep, fid_av* av, fid_cq* fcq, int fcq_fd,
              fi_addr_t peer, Fd oob, EndpointInfo info);
  ~RdmEndpoint() override { CloseAndDetach(); }

  // shm: the name of the peer's region, which only this endpoint opens
  // (one peer per endpoint, a random name per endpoint). Its creator
  // unlinks it when it closes; a killed peer cannot, so the name is also
  // unlinked here when the endpoint closes (mappings stay valid; the
  // creator's own unlink then finds nothing), and a killed peer leaves
  // nothing in /dev/shm once its survivor closes.
  void SetPeerShmRegion(std::string name) { peer_shm_region_ = std::move(name); }

  absl::Status Send(const void* buf, size_t len, MemoryRegion* mr, uint64_t context) override;
  absl::Status PostRecv(void* buf, size_t len, MemoryRegion* mr, uint64_t context) override;

 protected:
  int PostControlSend(Request* req) override;
  int PostControlRecv(Request* req) override;
  const char* SendCall() const override { return "fi_tsend"; }
  const char* RecvCall() const override { return "fi_trecv"; }
  void SendFinLocked(std::span<const uint8_t> fin, CompletionList* out) override;
  bool PeerEnded() override;
  void UnwatchConnectionLocked() override;
  void CloseConnectionLocked() override;
  void CloseBindingsLocked() override;

 private:
  absl::Status Inject(const void* buf, size_t len);
  absl::Status TryInject(const void* buf, size_t len, uint64_t context, bool* injected);

  fid_av* av_;
  Fd oob_;
  std::string peer_shm_region_;  // empty: none to unlink
};

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_RDM_ENDPOINT_H_
