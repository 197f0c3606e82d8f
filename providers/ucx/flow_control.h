// End-to-end flow control (core/flow_window.h holds the counters and the
// report's record).
//
// An endpoint hands UCX at most Settings::flow_window user sends (option
// flow_window, default 1024; 0: no limit) beyond what the peer has
// reported consumed. UCP completes an eager send once the message is out
// of the sender's hands, and the receiver's UCP keeps every message that
// arrives before its receive is posted on its unexpected queue, without
// bound and without telling the sender: a sender can grow a receiver that
// posts nothing without limit, over tcp and shared memory alike (the
// posix FIFO bounds only what is in flight, not what the receiver copies
// out of it). With the window the peer holds at most this many such
// messages, and later sends wait on the sender's side (EpCore::held) until
// the peer reports it has received more.
//
// Reports and held sends are sent by Worker::FlowLocked at the start of
// the next progress (or at the end of a PostRecv), never from inside a UCX
// callback (Worker::QueueFlowLocked queues the endpoint).
#ifndef ZSOCK_PROVIDERS_UCX_FLOW_CONTROL_H_
#define ZSOCK_PROVIDERS_UCX_FLOW_CONTROL_H_

#include "providers/ucx/ep_core.h"
#include "providers/ucx/op.h"
#include "providers/ucx/worker.h"

namespace zsock::ucx {

// Counts a message of the peer's that one of our receives consumed, and
// queues a report when one is due. Inline: a ping-pong's every receive.
inline void NoteConsumedLocked(EpCore* c) {
  if (!c->flow.on()) return;
  if (c->flow.ReportDue(++c->user_received)) c->worker->QueueFlowLocked(c);
}

// A user send (or an injected send's copy, already in `others`) waits for
// the window, behind those already waiting.
void HoldLocked(EpCore* c, Op* op);

}  // namespace zsock::ucx

#endif  // ZSOCK_PROVIDERS_UCX_FLOW_CONTROL_H_
