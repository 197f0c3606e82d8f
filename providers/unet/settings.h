// unet's fabric settings: the unet_* configuration keys
// (docs/configuration.md), overridden per fabric by its options
// ("unet?ring_entries=64&cma=off"), read and checked once when a fabric opens.
#ifndef ZSOCK_PROVIDERS_UNET_SETTINGS_H_
#define ZSOCK_PROVIDERS_UNET_SETTINGS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/provider.h"

namespace zsock::unet {

struct Settings {
  uint32_t ring_entries;  // descriptors per ring (a power of two)
  uint32_t buffer_size;   // bytes per segment buffer
  uint32_t nbuffers;      // user buffers per segment (a power of two)
  uint32_t key_slots;     // registrations the key table holds
  bool cma;               // try cross-memory attach for RDMA read/write
  absl::Duration connect_timeout;
};

// The settings for `spec`: InvalidArgument for an unknown option, a spec
// after "unet:", or a value the configuration keys refuse.
absl::StatusOr<Settings> LoadSettings(const FabricSpec& spec);

}  // namespace zsock::unet

#endif  // ZSOCK_PROVIDERS_UNET_SETTINGS_H_
