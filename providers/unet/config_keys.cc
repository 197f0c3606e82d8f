// unet's configuration keys (docs/configuration.md, docs/unet.md): the
// defaults of the fabric options of the same names without the prefix.
#include "core/config.h"

namespace zsock {
namespace {

const bool kRegistered = RegisterConfigKeys({
    {"unet_ring_entries", ConfigType::kInt, "256",
     "unet: descriptors per receive ring (power of two)", {}, 8, 65536},
    {"unet_buffer_size", ConfigType::kSize, "32K",
     "unet: size of one communication-segment buffer", {}, 4096, 16 << 20},
    {"unet_buffers", ConfigType::kInt, "64",
     "unet: buffers per communication segment (power of two)", {}, 8, 65536},
    {"unet_cma", ConfigType::kEnum, "auto",
     "unet: cross-memory attach for RDMA read/write: auto (probe at connect), "
     "off (always copy through the segment)",
     {"auto", "off"}},
    {"unet_max_registrations", ConfigType::kInt, "4096",
     "unet: size of the registration key table", {}, 16, 1 << 20},
});

}  // namespace
}  // namespace zsock
