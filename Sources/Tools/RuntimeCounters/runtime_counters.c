// Counts heap allocations by standing in for glibc's malloc, calloc, realloc and aligned
// allocations in the process that links this file (a definition in the executable takes
// precedence over the C library's for every library loaded), each passing the call on to
// glibc's own.
//
// Retains, releases and exclusivity checks are counted the same way: the Swift code linked
// into the executable calls the runtime's `swift_retain`, `swift_release`, their `_n` forms
// and `swift_beginAccess` through the symbol, and a definition here takes the call, counts
// it and passes it on to the runtime's own (found with dlsym). Calls the runtime makes to
// itself are not seen: what is counted is what the project's code asks for. (Not the
// runtime's hooks for Instruments, `_swift_retain`: on Linux, Swift 6.3's runtime faults
// once they are installed; swiftlang/swift#88924.)
#include "runtime_counters.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <errno.h>
#include <stddef.h>
#include <dlfcn.h>

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t count, size_t size);
extern void *__libc_realloc(void *pointer, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);

static atomic_bool counting;
static _Thread_local rc_counts thread_counts;
static _Atomic uint64_t process_allocations;
static _Atomic uint64_t process_retains;
static _Atomic uint64_t process_releases;
static _Atomic uint64_t process_access_checks;

// Off until asked for: the loader, the C library and the runtime start before threads are set up.
#define COUNT(field, process, amount) \
    do { \
        if (atomic_load_explicit(&counting, memory_order_relaxed)) { \
            thread_counts.field += (amount); \
            atomic_fetch_add_explicit(&process, (amount), memory_order_relaxed); \
        } \
    } while (0)

static inline void count(void) { COUNT(allocations, process_allocations, 1); }

void *malloc(size_t size) {
    count();
    return __libc_malloc(size);
}

void *calloc(size_t count_, size_t size) {
    count();
    return __libc_calloc(count_, size);
}

void *realloc(void *pointer, size_t size) {
    count();
    return __libc_realloc(pointer, size);
}

// The Swift runtime allocates what asks for an alignment of its own here.
int posix_memalign(void **result, size_t alignment, size_t size) {
    if (alignment < sizeof(void *) || (alignment & (alignment - 1)) != 0) return EINVAL;
    count();
    void *pointer = __libc_memalign(alignment, size);
    if (pointer == NULL && size != 0) return ENOMEM;
    *result = pointer;
    return 0;
}

void *aligned_alloc(size_t alignment, size_t size) {
    count();
    return __libc_memalign(alignment, size);
}

// The runtime's own entry points, found on first use: other libraries' start-up code calls
// them through these definitions before any constructor of this file could run. Threads
// that race to find one store the same address.
#define RUNTIME(name, type) \
    static _Atomic(type) name##_next; \
    static inline type name##_runtime(void) { \
        type next = atomic_load_explicit(&name##_next, memory_order_relaxed); \
        if (next == NULL) { \
            next = (type)dlsym(RTLD_NEXT, #name); \
            atomic_store_explicit(&name##_next, next, memory_order_relaxed); \
        } \
        return next; \
    }

typedef void *(*retain_fn)(void *);
typedef void *(*retain_n_fn)(void *, uint32_t);
typedef void (*release_fn)(void *);
typedef void (*release_n_fn)(void *, uint32_t);
typedef void (*begin_access_fn)(void *, void *, uintptr_t, void *);
RUNTIME(swift_retain, retain_fn)
RUNTIME(swift_retain_n, retain_n_fn)
RUNTIME(swift_release, release_fn)
RUNTIME(swift_release_n, release_n_fn)
RUNTIME(swift_beginAccess, begin_access_fn)

void *swift_retain(void *object) {
    if (object != NULL) COUNT(retains, process_retains, 1);
    return swift_retain_runtime()(object);
}

void *swift_retain_n(void *object, uint32_t n) {
    if (object != NULL) COUNT(retains, process_retains, n);
    return swift_retain_n_runtime()(object, n);
}

void swift_release(void *object) {
    if (object != NULL) COUNT(releases, process_releases, 1);
    swift_release_runtime()(object);
}

void swift_release_n(void *object, uint32_t n) {
    if (object != NULL) COUNT(releases, process_releases, n);
    swift_release_n_runtime()(object, n);
}

void swift_beginAccess(void *pointer, void *buffer, uintptr_t flags, void *pc) {
    COUNT(accessChecks, process_access_checks, 1);
    swift_beginAccess_runtime()(pointer, buffer, flags, pc);
}

void rc_install(void) {
    atomic_store_explicit(&counting, true, memory_order_relaxed);
}

rc_counts rc_this_thread(void) {
    return thread_counts;
}

rc_counts rc_process(void) {
    rc_counts counts = {
        atomic_load_explicit(&process_allocations, memory_order_relaxed),
        atomic_load_explicit(&process_retains, memory_order_relaxed),
        atomic_load_explicit(&process_releases, memory_order_relaxed),
        atomic_load_explicit(&process_access_checks, memory_order_relaxed),
    };
    return counts;
}
