// Sends that report no completion: injected user sends
// (Capabilities::inject_size, kInjectContext) and control messages (flow
// reports, core emulation's messages).
//
// SendNowLocked is the injected send's path (UcxEndpoint::Send ->
// SendNowLocked -> ucp_tag_send_nbx, a ping-pong's every reply): inline,
// so that zsock makes no call of its own before UCX's.
#ifndef ZSOCK_PROVIDERS_UCX_INJECT_H_
#define ZSOCK_PROVIDERS_UCX_INJECT_H_

#include <ucp/api/ucp.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "providers/ucx/ep_core.h"
#include "providers/ucx/op.h"

namespace zsock::ucx {

// Capabilities::inject_size: UCX's eager-short limit on shared memory (UCX
// 1.13's posix FIFO elements are 128 bytes; `ucp_ep_print_info` shows
// "0..<egr/short>..93"; tcp's is larger). UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL
// succeeds only on that short path: a longer injected send would always
// take the copy (an Op, a request, a callback), costlier than an ordinary
// send.
inline constexpr size_t kInjectSize = 92;

// The parameters of a send UCX must finish inside its call
// (UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL), built once: UCX reads only the fields
// op_attr_mask names, and zeroing the whole struct on every send would put
// its stores on a ping-pong reply's path.
constexpr ucp_request_param_t kImmediateParam = [] {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL;
  return p;
}();

// Sends a copy of `msg` that reports no completion (kInjectSend on the
// user tag, kControlSend on the control tag): the Op owns the bytes and
// waits in EpCore::others until UCX finishes it.
[[gnu::noinline]] absl::Status SendCopyLocked(EpCore* c, Op::Kind kind,
                                              std::span<const uint8_t> msg,
                                              absl::string_view what);

// What UCX did not finish inside SendNowLocked's call: a request (the flag
// ignored) or no room now (a copy goes instead).
[[gnu::noinline]] absl::Status SendNowSlowLocked(EpCore* c, Op::Kind kind,
                                                 std::span<const uint8_t> msg,
                                                 absl::string_view what, void* req);

// Sends `msg` without a completion (an injected send, or a control
// message such as a flow report) from the caller's buffer when UCX
// finishes it inside the call (UCP_OP_ATTR_FLAG_FORCE_IMM_CMPL: the
// common case, a message on the transport's eager-short path while
// nothing is queued), else from a copy (SendCopyLocked). UCP keeps the
// endpoint's sends in order either way. A control message longer than
// inject_size (an emulated RMA's data) goes from a copy at once: UCX
// would not finish it in the call.
[[gnu::always_inline]] inline absl::Status SendNowLocked(EpCore* c, Op::Kind kind,
                                                         std::span<const uint8_t> msg,
                                                         absl::string_view what) {
  if (msg.size() > kInjectSize) [[unlikely]] return SendCopyLocked(c, kind, msg, what);
  const bool user = kind == Op::Kind::kInjectSend;
  void* req =
      ucp_tag_send_nbx(c->uep, msg.data(), msg.size(), c->SendTag(!user), &kImmediateParam);
  if (req != nullptr) [[unlikely]] return SendNowSlowLocked(c, kind, msg, what, req);
  if (user) c->flow.Posted();
  return absl::OkStatus();
}

}  // namespace zsock::ucx

#endif  // ZSOCK_PROVIDERS_UCX_INJECT_H_
