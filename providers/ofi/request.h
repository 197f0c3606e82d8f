// Request: one operation an endpoint handed to libfabric (its fi_context2
// is the operation's context, so a CQ entry names it). RequestList: an
// endpoint's operations in flight. RequestCache: recycles requests per
// thread. All inline: every message posts and completes requests.
#ifndef ZSOCK_PROVIDERS_OFI_REQUEST_H_
#define ZSOCK_PROVIDERS_OFI_REQUEST_H_

#include <rdma/fabric.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/provider.h"

namespace zsock::ofi {

class OfiEndpoint;

// One operation in flight. fi_context2 first: libfabric may use it (FI_CONTEXT2).
struct Request {
  fi_context2 fi_ctx;
  OpType op = OpType::kSend;
  uint64_t context = 0;
  OfiEndpoint* ep = nullptr;
  size_t len = 0;
  bool control = false;
  bool orphaned = false;          // its endpoint has gone; drop its completion
  std::vector<uint8_t> owned;     // control message bytes / control receive buffer
  uint64_t operand[2] = {0, 0};   // atomic operands
  uint64_t result = 0;            // atomic result lands here
  uint64_t* user_result = nullptr;
  std::shared_ptr<MemoryRegion> pin;  // FI_MR_LOCAL: a cached registration of the buffer
  // In its endpoint's list of operations handed to libfabric (RequestList).
  Request* prev = nullptr;
  Request* next = nullptr;
  bool listed = false;
};

// The operations an endpoint has handed to libfabric and not yet completed:
// an intrusive list, so that posting and completing one costs no allocation
// and no hashing (measured: a hash set was a noticeable share of a small
// message's cost).
class RequestList {
 public:
  void insert(Request* r) {
    r->prev = nullptr;
    r->next = head_;
    if (head_ != nullptr) head_->prev = r;
    head_ = r;
    r->listed = true;
  }
  void erase(Request* r) {
    if (!r->listed) return;
    if (r->prev != nullptr) r->prev->next = r->next;
    else head_ = r->next;
    if (r->next != nullptr) r->next->prev = r->prev;
    r->prev = r->next = nullptr;
    r->listed = false;
  }
  // `r` must be a live request (e.g. one named by a CQ entry).
  static bool contains(const Request* r) { return r->listed; }
  Request* front() const { return head_; }
  bool empty() const { return head_ == nullptr; }

 private:
  Request* head_ = nullptr;
};

// Requests are recycled through a small per-thread cache: a ping-pong posts
// and completes two per round trip, and malloc plus free (core's release
// hooks included) cost more than the rest of a post. Written here because
// no library allocator recycles whole objects with their buffers' capacity.
class RequestCache {
 public:
  static Request* Get() {
    if (!t_gone && t_cache.head_ != nullptr) {
      Request* r = t_cache.head_;
      t_cache.head_ = r->next;
      --t_cache.count_;
      r->next = nullptr;
      return r;
    }
    return new Request();
  }
  static void Put(Request* r) {
    if (t_gone || t_cache.count_ >= kMax) {
      delete r;
      return;
    }
    Reset(r);
    r->next = t_cache.head_;
    t_cache.head_ = r;
    ++t_cache.count_;
  }

 private:
  static constexpr int kMax = 32;
  ~RequestCache() {
    t_gone = true;  // a request completed later on this thread is deleted
    while (head_ != nullptr) {
      Request* r = head_;
      head_ = r->next;
      delete r;
    }
  }
  // Fresh, but for a small buffer's capacity (control receive buffers,
  // 64 KiB each, are not kept); the pin goes back to the cache now. Field
  // by field: assigning a whole new Request builds one and moves it in,
  // which costs every message a share of an empty poll (measured). A field
  // added to Request changes its size, and the static_assert then asks for
  // it to be reset here too.
  static void Reset(Request* r) {
    static_assert(sizeof(Request) == 200, "a new Request field: reset it in RequestCache::Reset");
    r->fi_ctx = {};
    r->op = OpType::kSend;
    r->context = 0;
    r->ep = nullptr;
    r->len = 0;
    r->control = false;
    r->orphaned = false;
    if (r->owned.capacity() <= 64) {
      r->owned.clear();
    } else {
      std::vector<uint8_t>().swap(r->owned);
    }
    r->operand[0] = r->operand[1] = 0;
    r->result = 0;
    r->user_result = nullptr;
    r->pin.reset();
    r->prev = r->next = nullptr;
    r->listed = false;
  }

  Request* head_ = nullptr;
  int count_ = 0;
  static thread_local RequestCache t_cache;
  // Trivially destructible, so readable after t_cache's destructor ran
  // (thread exit, static destruction on the main thread).
  static thread_local bool t_gone;
};
inline thread_local RequestCache RequestCache::t_cache;
inline thread_local bool RequestCache::t_gone = false;

}  // namespace zsock::ofi

#endif  // ZSOCK_PROVIDERS_OFI_REQUEST_H_
