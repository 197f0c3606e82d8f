// Settings: the configuration string's options, zsock's rxm defaults, the
// fi_getinfo hints, and the explanation of a configuration that matches
// nothing.
#include "providers/ofi/settings.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/config.h"
#include "core/status.h"

namespace zsock::ofi {
namespace {

// Providers libfabric 1.17 can be built with: a name among them that this
// host does not offer is unavailable here; any other name is a mistake.
constexpr absl::string_view kKnownProviders[] = {
    "verbs", "efa", "psm2", "psm3", "opx", "usnic", "gni", "cxi", "tcp", "udp", "sockets",
    "shm", "sm2", "ucx", "ofi_rxm", "ofi_rxd", "ofi_mrail", "net", "bgq", "rstream"};

// What fi_getinfo offers on this host, "prov (endpoint type, domain)", for
// "provider not found" errors; `names` gets each provider name's parts
// ("tcp;ofi_rxm" -> tcp, ofi_rxm).
std::string OfferedProviders(std::vector<std::string>* names = nullptr) {
  fi_info* info = nullptr;
  std::vector<std::string> offers;
  if (fi_getinfo(kFiVersion, nullptr, nullptr, 0, nullptr, &info) == 0) {
    for (fi_info* i = info; i != nullptr; i = i->next) {
      const char* type = i->ep_attr->type == FI_EP_MSG ? "msg" : i->ep_attr->type == FI_EP_RDM ? "rdm" : "dgram";
      std::string n = absl::StrCat(i->fabric_attr->prov_name, " (", type, ", domain ", i->domain_attr->name, ")");
      if (std::find(offers.begin(), offers.end(), n) == offers.end()) offers.push_back(n);
      if (names != nullptr) {
        for (absl::string_view part : absl::StrSplit(i->fabric_attr->prov_name, ';')) {
          names->emplace_back(part);
        }
      }
    }
    fi_freeinfo(info);
  }
  return offers.empty() ? "nothing" : absl::StrJoin(offers, ", ");
}

absl::Status ParseCqWait(const std::string& v, Settings* s) {
  if (v == "fd") {
    s->cq_wait = Settings::CqWait::kFd;
  } else if (v == "none") {
    s->cq_wait = Settings::CqWait::kNone;
  } else if (v == "sockets") {
    s->cq_wait = Settings::CqWait::kSockets;
  } else {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("ofi option cq_wait=", v, " is not fd, none or sockets"),
                     "write cq_wait=fd (FI_WAIT_FD), cq_wait=none (FI_WAIT_NONE, for busy "
                     "polling) or cq_wait=sockets (ofi:tcp only: wait on the endpoints' TCP "
                     "sockets); leave it out for the default (sockets on ofi:tcp, else fd)");
  }
  return absl::OkStatus();
}

absl::Status ParseBackstop(const std::string& v, Settings* s) {
  int ms = -1;
  if (!absl::SimpleAtoi(v, &ms) || ms < 0 || ms > 60000) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("ofi option backstop_ms=", v, " is not a number of milliseconds "
                                  "from 0 to 60000"),
                     "write e.g. backstop_ms=64 (the default), or backstop_ms=0 for no timer");
  }
  s->backstop_ns = int64_t{ms} * 1000 * 1000;
  s->backstop_set = true;
  return absl::OkStatus();
}

// libfabric reads FI_* parameters from the environment when a provider
// initialises, once per process: an option sets one there, unless the
// environment already holds another value.
absl::Status SetFiParameter(const std::string& k, const std::string& v) {
  const char* old = std::getenv(k.c_str());
  if (old != nullptr && v != old) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("fabric option ", k, "=", v, " conflicts with the environment's ",
                                  k, "=", old),
                     "set it in one place: libfabric reads FI_* parameters once per process, "
                     "when the first ofi fabric opens (zsock sets FI_OFI_RXM_MSG_RX_SIZE=128 and "
                     "FI_OFI_RXM_CM_PROGRESS_INTERVAL=1000 then, unless they are set), so set it "
                     "in the environment or in the first fabric's string");
  }
  ::setenv(k.c_str(), v.c_str(), 0);
  return absl::OkStatus();
}

absl::Status ParseOption(const std::string& k, const std::string& v, Settings* s) {
  if (k == "iface" || k == "domain") {
    s->iface = v;
  } else if (k == "mr_local") {
    if (v != "on" && v != "off") {
      return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                       absl::StrCat("ofi option mr_local=", v, " is not on or off"),
                       "write mr_local=on to pass descriptors for every buffer (as FI_MR_LOCAL demands)");
    }
    s->mr_local = v == "on";
  } else if (k == "cq_wait") {
    return ParseCqWait(v, s);
  } else if (k == "backstop_ms") {
    return ParseBackstop(v, s);
  } else if (k == "flow_window") {
    auto n = Config::ParseFlowWindow("ofi", v, "rxm");
    if (!n.ok()) return n.status();
    s->flow_window = *n;
  } else if (absl::StartsWith(k, "FI_")) {
    return SetFiParameter(k, v);
  } else {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("unknown ofi option '", k, "'"),
                     "ofi accepts iface=<domain> (e.g. lo, eth0), mr_local=on|off, cq_wait=fd|none|sockets, "
                     "backstop_ms=<ms>, flow_window=<messages> and FI_* "
                     "libfabric parameters");
  }
  return absl::OkStatus();
}

// zsock's defaults for rxm, where neither the environment nor an option
// set them (docs/ofi.md).
void SetRxmDefaults() {
  // Each zsock connection over rxm is an rxm endpoint with exactly one
  // peer, but rxm 1.17 sizes the shared receive context of its tcp
  // connections for many peers, in bounce buffers of 16 KiB. 128 buffers,
  // rxm's own size without a shared context, suit one peer and cut the
  // memory each connection holds.
  ::setenv("FI_OFI_RXM_MSG_RX_SIZE", "128", 0);
  // rxm runs its connection manager from fi_cq_read at most every
  // FI_OFI_RXM_CM_PROGRESS_INTERVAL us (10 ms by default), and each step of
  // connecting on first use (request, accept, established) waits for one,
  // on both sides, so a first message to a new peer waited several
  // intervals. 1 ms makes connection set-up several times shorter and
  // leaves the busy poll's ping-pong unchanged (measured, docs/ofi.md).
  ::setenv("FI_OFI_RXM_CM_PROGRESS_INTERVAL", "1000", 0);
}

}  // namespace

absl::StatusOr<Settings> LoadSettings(const FabricSpec& spec) {
  const auto& global = Config::Global();
  if (!global.ok()) return global.status();
  Settings s;
  s.prov = spec.spec;
  s.connect_timeout = absl::Milliseconds(global->GetInt("connect_timeout_ms"));
  for (const auto& [k, v] : spec.options) {
    if (absl::Status st = ParseOption(k, v, &s); !st.ok()) return st;
  }
  SetRxmDefaults();
  return s;
}

fi_info* MakeHints(const Settings& s, fi_ep_type type, uint64_t caps, int mr_mode) {
  fi_info* hints = fi_allocinfo();
  hints->ep_attr->type = type;
  hints->caps = caps;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode = mr_mode;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->tx_attr->msg_order = FI_ORDER_SAS;
  hints->rx_attr->msg_order = FI_ORDER_SAS;
  if (!s.prov.empty()) hints->fabric_attr->prov_name = strdup(s.prov.c_str());
  if (!s.iface.empty()) hints->domain_attr->name = strdup(s.iface.c_str());
  return hints;
}

namespace {

// A provider name part that fi_getinfo does not offer: unknown (a
// mistake) or unavailable here (with the reason where one is known).
absl::Status MissingProvider(absl::string_view part, const std::string& fix) {
  if (std::find(std::begin(kKnownProviders), std::end(kKnownProviders), part) ==
      std::end(kKnownProviders)) {
    return MakeError(absl::StatusCode::kInvalidArgument, EINVAL,
                     absl::StrCat("fi_getinfo: libfabric has no provider named '", part, "'"),
                     absl::StrCat("write ofi:<provider> with one of them; ", fix));
  }
  std::string why;
  if (part == "verbs") {
    why = ::access("/sys/class/infiniband", F_OK) == 0
              ? ": no usable RDMA device (libfabric's verbs provider did not initialise)"
              : ": this host has no RDMA device (/sys/class/infiniband is absent)";
  }
  return MakeError(absl::StatusCode::kUnavailable, ENODEV,
                   absl::StrCat("fi_getinfo: libfabric's ", part, " provider is not available here",
                                why.empty() ? ": it was not built in or found nothing to drive" : why),
                   absl::StrCat("use a provider this host offers; ", fix));
}

}  // namespace

absl::Status NoProvider(const Settings& s, fi_ep_type type, uint64_t caps, int rc) {
  std::vector<std::string> names;
  const std::string offers = OfferedProviders(&names);
  const std::string fix = absl::StrCat("libfabric offers: ", offers);
  for (absl::string_view part : absl::StrSplit(s.prov, ';', absl::SkipEmpty())) {
    if (std::find(names.begin(), names.end(), part) != names.end()) continue;
    return MissingProvider(part, fix);
  }
  // The provider exists; the endpoint type, domain or demands do not match.
  fi_info* hints = MakeHints(s, type, caps, kMrModes | FI_MR_ENDPOINT);
  fi_info* info = nullptr;
  const bool wants_mr_endpoint = fi_getinfo(kFiVersion, nullptr, nullptr, 0, hints, &info) == 0;
  if (info) fi_freeinfo(info);
  fi_freeinfo(hints);
  if (wants_mr_endpoint) {
    return MakeError(absl::StatusCode::kFailedPrecondition, EOPNOTSUPP,
                     absl::StrCat("fi_getinfo: provider '", s.prov,
                                  "' requires FI_MR_ENDPOINT (registrations bound to one endpoint)"),
                     "zsock registrations serve every endpoint of a fabric; use another provider");
  }
  return MakeError(absl::StatusCode::kUnavailable, rc < 0 ? -rc : rc,
                   absl::StrCat("fi_getinfo found no ", type == FI_EP_MSG ? "connected (FI_EP_MSG)" : "reliable-datagram (FI_EP_RDM)",
                                " endpoint for provider '", s.prov.empty() ? "any" : s.prov, "'",
                                s.iface.empty() ? "" : absl::StrCat(" on domain ", s.iface),
                                " with messages", (caps & FI_RMA) ? " and RMA" : "", ": ",
                                fi_strerror(rc < 0 ? -rc : rc)),
                   absl::StrCat(s.iface.empty() ? "" : "check iface= (a domain name below); ", fix));
}

}  // namespace zsock::ofi
