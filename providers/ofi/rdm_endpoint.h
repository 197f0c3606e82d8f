// RdmEndpoint: a zsock endpoint over one FI_EP_RDM endpoint that reaches
// its one peer through an address vector. User and control messages go by
// the tagged interface with different tags, so a user message waiting for
// a posted receive never blocks control traffic. The TCP socket the peers
// bootstrapped over (rdm_connect.cc) stays open: its end is the liveness
// signal, and it carries the graceful close's FIN.
#ifndef ZSOCK_PROVIDERS_OFI_RDM_ENDPOINT_H_
#define ZSOCK_PROVIDERS_OFI_RDM_ENDPOINT_H_

#include <rdma/fi_domain.h>

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
};

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_RDM_ENDPOINT_H_
