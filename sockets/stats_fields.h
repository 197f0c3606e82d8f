// The fields of struct zs_stats (sockets/zsock.h), in its order, as an
// X-macro: ZSOCK_STATS_FIELDS(X) expands X(name) once per field. One list
// for the code that copies the counters (socket.cc) and the code that
// prints them by name (bench/zsock_ops.cc); a field added to the struct and
// not here fails socket.cc's count check.
#ifndef ZSOCK_SOCKETS_STATS_FIELDS_H_
#define ZSOCK_SOCKETS_STATS_FIELDS_H_

#define ZSOCK_STATS_FIELDS(X)                                                              \
  X(bytes_sent_bcopy) X(bytes_sent_srcavail) X(bytes_sent_sinkavail) X(bytes_recv_bcopy)   \
  X(bytes_recv_srcavail) X(bytes_recv_sinkavail) X(messages_sent) X(messages_received)     \
  X(coalesced_sends) X(credit_stalls) X(credit_updates_sent) X(autocork_holds)             \
  X(ack_requests) X(ack_answers) X(queued_bytes) X(held_bytes) X(srcavail_sent)            \
  X(srcavail_cancels) X(sendsmall) X(sinkavail_sent) X(sinkavail_cancels) X(sinkavail_void) \
  X(sinkavail_received) X(cancels_received) X(rdma_fallbacks) X(az_srcavail_sent)          \
  X(az_bytes) X(az_hybrid_bcopy) X(az_unprotectable) X(az_faults) X(az_copies)             \
  X(az_blocks) X(az_fallbacks) X(az_recv_early) X(pull_srcavail_sent) X(bytes_sent_pull)   \
  X(bytes_recv_pull)

#endif  // ZSOCK_SOCKETS_STATS_FIELDS_H_
