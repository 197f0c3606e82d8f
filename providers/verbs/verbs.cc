// verbs: the zsock provider interface directly over rdma-core 44
// (libibverbs + librdmacm): reliable-connected queue pairs set up with
// librdmacm, on real HCAs (InfiniBand, RoCE, iWARP) or Soft-RoCE.
//
//   verbs[:DEVICE][?port=N&gid_index=N&inline=N&srq=on&cq_depth=N&sq_depth=N&...]
//
// Per fabric: the device's librdmacm verbs context (rdma_get_devices), one
// protection domain, optionally one shared receive queue (srq=on), a
// registration table for emulated accesses. Per zsock CQ: one completion
// channel and an epoll set (channel fd, core's wake fd, each endpoint's CM
// event channel). Per endpoint: an rdma_cm id on its own event channel, its
// own ibv_cq on the CQ's completion channel, an RC QP, a slab of registered
// receive buffers (eager_size each) and of send slots.
//
// Messages (framing in wire.h, docs/verbs.md): a message up to
// eager_size - 24 bytes is copied into a send slot and sent (inline when it
// fits max_inline_data); a larger one is announced by a rendezvous request
// naming the sender's buffer (registered through the pin-down cache), which
// the receiver RDMA-reads into the matched receive before it answers FIN.
// Receive buffers are credit-controlled (credits piggyback on every message,
// an explicit update goes out when half the window was refilled), so the
// receiver is never overrun; rnr_retry=7 is the backstop. RDMA read/write
// and atomics are native (atomics only where the device reports
// IBV_ATOMIC_HCA/GLOB on both sides; else core emulation). Work requests that
// find the send queue or the peer's credits exhausted wait in order in a
// backlog that completions drain (back-pressure without blocking callers).
//
// Where it lives. Decided without a device, and unit-tested (the
// verbs_core target): settings.h (configuration, device selection,
// addresses), wire.h (key blob, hello, message header), work_request.h
// (access flags, work requests, completion errors), matcher.h, credits.h,
// region.h (registrations, recorded in core/local_keys.h's table),
// core/slab.h, and the message engine (engine.h, over a Transport seam). On the device (this target): fabric.h
// (the fabric; fabric_setup.cc opens the device), cq.h, endpoint.h,
// connect.cc (listen, accept, connect) and cm.h (librdmacm helpers); this
// file registers the provider.
#include "core/provider.h"
#include "providers/verbs/fabric.h"

namespace zsock::verbs {
namespace {

const bool kRegistered = RegisterProvider(ProviderInfo{
    "verbs",
    "rdma-core RC queue pairs over librdmacm (InfiniBand, RoCE, iWARP, Soft-RoCE)",
    {"verbs"},
    [](const FabricSpec& spec) { return VerbsFabric::Open(spec); },
});

}  // namespace
}  // namespace zsock::verbs
