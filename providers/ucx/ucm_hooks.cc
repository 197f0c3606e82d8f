// Keeps UCX's memory hooks (UCM) from silencing zsock's (core/memhooks).
//
// When libucs is loaded its constructor calls ucm_library_init, which with
// UCX's defaults (UCX_MEM_EVENTS=y, UCX_MEM_MMAP_HOOK_MODE=bistro) rewrites
// the first instructions of the first munmap, mremap, madvise, shmdt, mmap,
// brk... definitions in the process so that they jump into UCM. In a zsock
// binary several of those are zsock's own interposers, which then never run:
// with the ucx provider merely linked in, no provider's registrations were
// invalidated on munmap any more. UCM reads its settings only at that
// moment, before any zsock code runs (even an executable's .preinit_array
// cannot help: libc's initializer resets the environment it would edit),
// so no per-fabric setting can prevent it.
//
// So zsock cooperates instead: when UCM's events are on, this registers a
// UCM handler for UCM_EVENT_VM_UNMAPPED (munmap, mremap, madvise DONTNEED/
// FREE, shmdt, brk shrink, mmap over existing pages) that forwards the range
// to zsock's handlers before the memory goes. zsock's free/realloc/operator
// delete interposers are not patched by UCM and keep working. An unmap both
// hooks see is reported twice, which invalidation tolerates. Registering
// would also make UCM replace malloc (UCX_MEM_MALLOC_HOOKS); zsock does not
// need that, so it is suppressed for this registration only.
//
// With UCX_MEM_EVENTS=no in the environment UCM installs nothing and
// zsock's interposers are the only hooks (docs/ucx.md).
#include <ucm/api/ucm.h>

#include "core/log.h"
#include "core/memhooks.h"

namespace zsock::ucx {
namespace {

void ForwardUnmap(ucm_event_type_t type, ucm_event_t* event, void*) {
  if (type == UCM_EVENT_VM_UNMAPPED) {
    NotifyMemoryReleased(event->vm_unmapped.address, event->vm_unmapped.size);
  }
}

// A static initializer: runs after every shared library's constructor, so
// UCM has read its settings and installed its hooks.
const bool kUcmForwarding = [] {
  if (!ucm_global_opts.enable_events || !MemoryHooksActive()) return false;
  const int malloc_hooks = ucm_global_opts.enable_malloc_hooks;
  ucm_global_opts.enable_malloc_hooks = 0;
  // The lowest priority value runs first: before UCX's own handlers.
  ucs_status_t st = ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, -1000, ForwardUnmap, nullptr);
  ucm_global_opts.enable_malloc_hooks = malloc_hooks;
  if (st != UCS_OK) {
    ZS_LOG(kWarn,
           "UCX's memory hooks replace zsock's munmap/mremap/madvise/shmdt hooks and "
           "forwarding their events failed (%s): registrations are not invalidated when "
           "memory is unmapped; fix: set UCX_MEM_EVENTS=no in the environment",
           ucs_status_string(st));
    return false;
  }
  return true;
}();

}  // namespace
}  // namespace zsock::ucx
