// Resolves the memory hooks' next definitions from the executable's
// .preinit_array, before any shared library's initializer can release
// memory (memhooks.cc). Only in executables that link the hooks in
// (//core:memhooks); a shared object cannot have a .preinit_array, so
// libzsock.so.1 is built without this file and resolves from a constructor.
namespace zsock {
extern void (*const kMemhooksResolveAll)(int, char**, char**);
namespace {
void PreinitResolveAll(int argc, char** argv, char** envp) {
  kMemhooksResolveAll(argc, argv, envp);
}
__attribute__((section(".preinit_array"), used)) void (*const kPreinitResolveAll)(
    int, char**, char**) = &PreinitResolveAll;
}  // namespace
}  // namespace zsock
