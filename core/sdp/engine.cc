// sdp::Engine's set-up and teardown, its connections' start (Connect,
// Listen and Accept, and the SDP handshake they wait for) and the AZ-SDP
// lock tables. The progress (waits, polls, dispatch, readiness callbacks)
// is in progress.cc.
#include "core/sdp/engine.h"

#include <sys/eventfd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/log.h"
#include "core/mutex.h"
#include "core/sdp/conn_state.h"
#include "core/status.h"

namespace zsock::sdp {

namespace {

absl::Duration Until(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return absl::Hours(1);
  return std::max(deadline - absl::Now(), absl::ZeroDuration());
}

}  // namespace

Engine::Engine(SpinBounds spin) : spin_(spin) {}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(EngineOptions options) {
  std::string spec = options.fabric;
  if (spec.empty()) {
    const auto& config = Config::Global();
    if (!config.ok()) return config.status();
    spec = config->GetString("provider");
  }
  auto fabric = Fabric::Open(spec);
  if (!fabric.ok()) return fabric.status();
  if (!(*fabric)->caps().thread_safe) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("fabric '", spec,
                                  "' is single-threaded, and the SDP engine calls it from its "
                                  "progress thread and the application's threads"),
                     "drop threads=serialized from the provider's options");
  }
  auto cq = (*fabric)->CreateCq();
  if (!cq.ok()) return cq.status();
  std::unique_ptr<Engine> e(new Engine(options.spin.value_or(ConfiguredSpin())));
  e->notify_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (options.progress_thread) e->bg_notify_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  e->fabric_ = std::move(*fabric);
  e->cq_ = std::move(*cq);
  if (options.progress_thread) {
    e->progress_thread_ = std::thread([raw = e.get()] { raw->ProgressThread(); });
  }
  return e;
}

Engine::~Engine() {
  // The guard's service thread must be done with us (az.cc).
  if (az_used_.load()) az::Guard::Get().RemoveClient(fault_client());
  {
    MutexLock lock(&mu_);
    stop_ = true;
    NotifyLocked();
  }
  if (progress_thread_.joinable()) progress_thread_.join();
  {
    MutexLock lock(&mu_);
    if (!conns_.empty()) {
      ZS_LOG(kWarn, "sdp engine destroyed with %d connections open; closing them",
             static_cast<int>(conns_.size()));
      for (auto& [id, c] : conns_) {
        c->AzRxAbandon();
        c->AzReleaseAll();
        c->CloseEndpoint();
      }
      conns_.clear();
    }
    lock_regions_.clear();  // registrations go before their fabric
  }
  cq_.reset();
  fabric_.reset();
}

EngineStats Engine::stats() const {
  MutexLock lock(&mu_);
  EngineStats s = stats_;
  s.leader_sleeps = leader_sleeps_.load(std::memory_order_relaxed);
  s.background_wakes = background_wakes_.load(std::memory_order_relaxed);
  s.spin_ns = spin_.budget_ns();
  return s;
}

void Engine::RemoveLocked(uint64_t id) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  it->second->AzRxAbandon();
  it->second->AzReleaseAll();
  if (it->second->az.table_index >= 0) ReleaseLockTable(it->second->az.table_index);
  conns_.erase(it);
}

namespace {
constexpr int kTablesPerRegion = 128;  // 64 KiB regions of 512-byte tables
constexpr size_t kTableBytes = kAzMaxSlots * sizeof(uint64_t);
}  // namespace

absl::StatusOr<int> Engine::AcquireLockTable() {
  if (free_lock_tables_.empty()) {
    auto r = fabric_->AllocateRegistered(kTablesPerRegion * kTableBytes, kAccessAll);
    if (!r.ok()) return r.status();
    const int base = static_cast<int>(lock_regions_.size()) * kTablesPerRegion;
    lock_regions_.push_back(std::move(*r));
    for (int i = kTablesPerRegion; i-- > 0;) free_lock_tables_.push_back(base + i);
  }
  int index = free_lock_tables_.back();
  free_lock_tables_.pop_back();
  return index;
}

MemoryRegion* Engine::LockTableRegion(int index, uint64_t** words) {
  MemoryRegion* r = lock_regions_[index / kTablesPerRegion].get();
  *words = reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(r->addr()) +
                                       (index % kTablesPerRegion) * kTableBytes);
  return r;
}

void Engine::ReleaseLockTable(int index) { free_lock_tables_.push_back(index); }

absl::StatusOr<std::unique_ptr<Listener>> Engine::Listen(absl::string_view address,
                                                          ConnectionOptions options) {
  auto l = fabric_->Listen(address);
  if (!l.ok()) return l.status();
  return std::unique_ptr<Listener>(new Listener(this, std::move(*l), std::move(options)));
}

// connect_timeout_ms from the configuration: how long a connection's set-up
// and SDP handshake may take.
static absl::Duration ConnectTimeout() {
  const auto& config = Config::Global();
  return absl::Milliseconds(config.ok() ? config->GetInt("connect_timeout_ms") : 10000);
}

absl::StatusOr<std::unique_ptr<Connection>> Engine::Connect(absl::string_view address,
                                                            ConnectionOptions options,
                                                            absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) deadline = absl::Now() + ConnectTimeout();
  auto ep = fabric_->Connect(address, cq_.get(), Until(deadline));
  if (!ep.ok()) return ep.status();
  return Start(std::move(*ep), std::move(options), /*active=*/true, deadline);
}

absl::StatusOr<std::unique_ptr<Connection>> Engine::Start(std::unique_ptr<Endpoint> ep,
                                                          ConnectionOptions options, bool active,
                                                          absl::Time deadline) {
  std::unique_ptr<Connection> conn;
  {
    MutexLock lock(&mu_);
    auto state = std::make_unique<ConnState>();
    ConnState* c = state.get();
    c->engine = this;
    c->id = next_id_++;
    c->ep = std::move(ep);
    c->opt = std::move(options);
    c->active = active;
    conns_[c->id] = std::move(state);
    absl::Status st = c->Init();
    if (st.ok()) {
      WaitLocked([&] { return c->phase == ConnState::Phase::kOpen || !c->failure.error.ok(); },
                 deadline);
      // A connection that opened and failed right after (the peer sent its
      // data and closed before this thread woke) is returned like TCP's:
      // its data and end of stream, or its error, come with the next calls.
      if (c->phase != ConnState::Phase::kOpen) {
        st = !c->failure.error.ok()
                 ? c->failure.error
                 : MakeError(absl::StatusCode::kDeadlineExceeded, ETIMEDOUT,
                             absl::StrCat("SDP handshake with ", c->peer_address,
                                          " did not finish in time"),
                             "check that the peer runs zsock's SDP engine (protocol version 1)");
      }
    }
    if (!st.ok()) {
      c->phase = ConnState::Phase::kClosed;
      c->CloseEndpoint();
      RemoveLocked(c->id);
      return st;
    }
    c->TryTransmit();
    NoteReadinessLocked(c);
    conn.reset(new Connection(this, c));
  }
  RunCallbacks();
  return conn;
}

// ---------------------------------------------------------------- Listener

Listener::~Listener() = default;

std::string Listener::address() const { return listener_->address(); }

int Listener::fd() const { return listener_->fd(); }

absl::StatusOr<std::unique_ptr<Connection>> Listener::Accept(absl::Time deadline) {
  auto ep = listener_->Accept(engine_->cq_.get(), Until(deadline));
  if (!ep.ok()) return ep.status();
  // Arrived: the SDP Hello gets the connect timeout, as the provider's
  // set-up does (a caller waiting in short slices cuts no handshake short).
  return engine_->Start(std::move(*ep), options_, /*active=*/false,
                        std::max(deadline, absl::Now() + ConnectTimeout()));
}

}  // namespace zsock::sdp
