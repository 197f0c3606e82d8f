// Listening and connecting, by endpoint type (OfiFabric::Listen and
// Connect choose). Addresses are "IP:PORT"; a refused connection fails at
// once, as TCP's does.
//
// RDM (rdm_connect.cc): a listener is a TCP socket; each zsock connection
// is one RdmEndpoint with an address vector holding its one peer, whose
// fi_getname address the two sides exchange over that TCP connection
// (OfiHello), which then stays open as the endpoint's liveness signal.
//
// MSG (msg_connect.cc): a listener is a passive endpoint (fi_listen) whose
// event queue is waited on through its FI_WAIT_FD object; a zsock
// connection is two FI_EP_MSG endpoints (MsgEndpoint: user messages and
// RMA; core's control messages), connected one after the other and paired
// on the passive side by the nonce in their connection data (CmData).
#ifndef ZSOCK_PROVIDERS_OFI_CONNECT_H_
#define ZSOCK_PROVIDERS_OFI_CONNECT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/provider.h"

namespace zsock::ofi {

class OfiFabric;

absl::StatusOr<std::unique_ptr<Listener>> ListenRdm(OfiFabric* fabric, absl::string_view address);
absl::StatusOr<std::unique_ptr<Endpoint>> ConnectRdm(OfiFabric* fabric, absl::string_view address,
                                                     CompletionQueue* cq, absl::Duration timeout);

absl::StatusOr<std::unique_ptr<Listener>> ListenMsg(OfiFabric* fabric, absl::string_view address);
absl::StatusOr<std::unique_ptr<Endpoint>> ConnectMsg(OfiFabric* fabric, absl::string_view address,
                                                     CompletionQueue* cq, absl::Duration timeout);

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_CONNECT_H_
