// Runtime of the Metal execution harness: dispatch, fibers, barriers, SIMD collectives,
// threadgroup memory and crash capture. Compiled once per compiler and linked into every
// kernel library; see __init__.py for the model it implements.
//
// Execution model
//   A dispatch runs threadgroups one after another on the calling OS thread. A kernel that
//   never synchronises runs as a plain loop over its GPU threads (fast path). Otherwise every
//   GPU thread of a threadgroup is a fiber with its own stack; threadgroup_barrier and the
//   simd_* collectives park the calling fiber, and a scheduler resumes fibers only when every
//   participant (the threadgroup, or the lanes of a SIMD-group) has arrived. Anything else
//   (a thread that returns while others wait, lanes at different collectives) is an error.
//   An exact dispatch (Launch::exact, Metal's dispatchThreads) has only `count` threads: its
//   last threadgroup may be short, and a threadgroup whose size is not a multiple of 32 ends
//   in a short SIMD-group; the threads past them do not exist (they neither run nor take part
//   in barriers and collectives), and a collective that reads one of their lanes reads NaN
//   bytes (Metal leaves that value undefined).
//
// Crash capture
//   SIGSEGV/SIGBUS/SIGFPE/SIGILL handlers are installed for the duration of a dispatch only,
//   run on an alternate signal stack (fiber stack overflow is a fault too), and siglongjmp back
//   to the dispatch, which reports the signal and fault address. Faults on other OS threads
//   are handed to the previous handler.

#include "emulator_abi.h"

#include <csetjmp>
#include <csignal>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
#include <unistd.h>

#if !defined(__x86_64__) || defined(EMU_USE_UCONTEXT)
#define EMU_UCONTEXT 1
#include <ucontext.h>
#endif

using namespace __emu;

extern "C" {
Thread* __emu_cur = nullptr;
const Launch* __emu_launch = nullptr;
}

namespace {

// ----------------------------------------------------------------------------- errors
sigjmp_buf g_jump;
Outcome* g_out = nullptr;
thread_local volatile sig_atomic_t t_in_dispatch = 0;
struct sigaction g_previous[4];
const int kSignals[4] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};

[[noreturn]] void fail_message(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] void fail_message(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_out->msg, sizeof g_out->msg, fmt, ap);
    va_end(ap);
    g_out->code = kFailed;
    siglongjmp(g_jump, 1);
}

void on_signal(int sig, siginfo_t* info, void*) {
    if (!t_in_dispatch) {
        // Not ours: restore the previous disposition and let the fault happen again.
        for (int i = 0; i < 4; ++i)
            if (kSignals[i] == sig) sigaction(sig, &g_previous[i], nullptr);
        return;
    }
    g_out->code = kSignal;
    g_out->signo = sig;
    g_out->fault_addr = info->si_addr;
    siglongjmp(g_jump, 2);
}

void install_handlers() {
    static thread_local bool alt_ready = false;
    if (!alt_ready) {
        stack_t ss;
        ss.ss_size = 1 << 16;
        ss.ss_sp = malloc(ss.ss_size);
        ss.ss_flags = 0;
        sigaltstack(&ss, nullptr);
        alt_ready = true;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 4; ++i) sigaction(kSignals[i], &sa, &g_previous[i]);
}

void restore_handlers() {
    for (int i = 0; i < 4; ++i) sigaction(kSignals[i], &g_previous[i], nullptr);
}

// ----------------------------------------------------------------------------- random order
struct Rng {
    uint64_t s;
    uint64_t next() {
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
};

// Fills order[0..n) with 0..n-1 in the schedule's order.
void make_order(unsigned* order, unsigned n, unsigned schedule, Rng& rng) {
    for (unsigned i = 0; i < n; ++i) order[i] = schedule == kReverse ? n - 1 - i : i;
    if (schedule == kAdversarial)
        for (unsigned i = n; i > 1; --i) {
            unsigned j = (unsigned)(rng.next() % i);
            unsigned t = order[i - 1]; order[i - 1] = order[j]; order[j] = t;
        }
}

// ----------------------------------------------------------------------------- threadgroup sizes
// Threads of threadgroup tg: tg_size, but the last threadgroup of an exact dispatch has only
// the threads left of count.
unsigned threads_of(const Launch* L, unsigned tg) {
    if (!L->exact) return L->tg_size;
    unsigned long long first = (unsigned long long)tg * L->tg_size;
    unsigned long long left = L->count > first ? L->count - first : 0;
    return left < L->tg_size ? (unsigned)left : L->tg_size;
}

// Lanes of SIMD-group s of a threadgroup of n threads.
unsigned lanes_of(unsigned n, unsigned s) {
    unsigned left = n - s * kSimdWidth;
    return left < kSimdWidth ? left : kSimdWidth;
}

// ----------------------------------------------------------------------------- threadgroup memory
long g_page = 0;
char* g_arena = nullptr;       // kThreadgroupMemory bytes, then a PROT_NONE page
unsigned g_poisoned = 0;       // bytes of the arena poisoned in the current threadgroup
unsigned g_high_water = 0;

void ensure_arena() {
    if (g_arena) return;
    long page = sysconf(_SC_PAGESIZE);
    g_page = page;
    char* p = (char*)mmap(nullptr, kThreadgroupMemory + page, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) abort();
    mprotect(p + kThreadgroupMemory, page, PROT_NONE);
    g_arena = p;
}

// ----------------------------------------------------------------------------- fibers
enum State { kReady, kAtBarrier, kAtSimd, kDone };
enum { kStackBytes = 64 * 1024, kSlotBytes = 64 };

struct Fiber {
    void* sp;
#ifdef EMU_UCONTEXT
    ucontext_t uc;
#endif
    int state;
    int line;      // source line of the barrier or collective the fiber waits at
    int op;        // which collective (0 = barrier)
    unsigned collectives;
    Thread th;
};

Fiber* g_fibers = nullptr;
char* g_stacks = nullptr;          // per fiber: guard page, then kStackBytes
unsigned g_fiber_capacity = 0;
char* g_slots = nullptr;           // [simdgroup][parity][lane][kSlotBytes]
unsigned* g_order = nullptr;
unsigned* g_sg_order = nullptr;
Fiber* g_running = nullptr;
ThreadFn g_thread_fn = nullptr;
void* g_sched_sp = nullptr;
#ifdef EMU_UCONTEXT
ucontext_t g_sched_uc;
#endif

#ifndef EMU_UCONTEXT
// Saves the callee-saved registers on the current stack, stores the stack pointer in *from,
// and resumes the stack `to` saved the same way. The FP control words are shared by all fibers
// (kernels do not change rounding modes), so they are not switched.
extern "C" void __emu_switch(void** from, void* to);
asm(R"(
    .text
    .p2align 4
    .type __emu_switch,@function
__emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size __emu_switch,.-__emu_switch
)");
#endif

void fiber_main() {
    Fiber* f = g_running;
    g_thread_fn(__emu_launch, &f->th);
    f = g_running;
    f->state = kDone;
#ifdef EMU_UCONTEXT
    swapcontext(&f->uc, &g_sched_uc);
#else
    __emu_switch(&f->sp, g_sched_sp);
#endif
    __builtin_unreachable();
}

void ensure_fibers(unsigned n) {
    if (n <= g_fiber_capacity) return;
    g_page = sysconf(_SC_PAGESIZE);
    size_t per = kStackBytes + g_page;
    char* stacks = (char*)mmap(nullptr, per * n, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (stacks == MAP_FAILED) abort();
    for (unsigned i = 0; i < n; ++i) mprotect(stacks + i * per, g_page, PROT_NONE);
    if (g_stacks) munmap(g_stacks, (kStackBytes + g_page) * g_fiber_capacity);
    free(g_fibers); free(g_slots); free(g_order); free(g_sg_order);
    g_stacks = stacks;
    g_fibers = (Fiber*)calloc(n, sizeof(Fiber));
    g_slots = (char*)calloc((size_t)(n / kSimdWidth + 1) * 2 * kSimdWidth * kSlotBytes, 1);
    g_order = (unsigned*)calloc(n, sizeof(unsigned));
    g_sg_order = (unsigned*)calloc(n / kSimdWidth + 1, sizeof(unsigned));
    g_fiber_capacity = n;
}

void start_fiber(unsigned i) {
    Fiber& f = g_fibers[i];
    // Stagger the stack tops by whole cache lines: tops a multiple of 4 KiB apart would all
    // compete for the same cache sets.
    char* top = g_stacks + (size_t)i * (kStackBytes + g_page) + g_page + kStackBytes - (i % 61) * 64;
#ifdef EMU_UCONTEXT
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = top - kStackBytes;
    f.uc.uc_stack.ss_size = kStackBytes;
    f.uc.uc_link = nullptr;
    makecontext(&f.uc, fiber_main, 0);
#else
    // Frame popped by __emu_switch: r15..rbp, then the return address fiber_main, whose own
    // return slot (never used) keeps the stack 16-byte aligned at its entry.
    uint64_t* sp = (uint64_t*)top;
    *--sp = 0;
    *--sp = (uint64_t)(uintptr_t)&fiber_main;
    for (int r = 0; r < 6; ++r) *--sp = 0;
    f.sp = sp;
#endif
}

void resume(Fiber* f) {
    g_running = f;
    __emu_cur = &f->th;
#ifdef EMU_UCONTEXT
    swapcontext(&g_sched_uc, &f->uc);
#else
    __emu_switch(&g_sched_sp, f->sp);
#endif
}

void park(Fiber* f) {
#ifdef EMU_UCONTEXT
    swapcontext(&f->uc, &g_sched_uc);
#else
    __emu_switch(&f->sp, g_sched_sp);
#endif
}

const char* op_name(int op) {
    static const char* names[] = {
        "threadgroup_barrier", "simdgroup_barrier", "simd_sum", "simd_product", "simd_max",
        "simd_min", "simd_and", "simd_or", "simd_xor", "simd_broadcast", "simd_broadcast_first",
        "simd_shuffle", "simd_shuffle_up", "simd_shuffle_down", "simd_shuffle_xor",
        "simd_shuffle_rotate_up", "simd_shuffle_rotate_down", "simd_prefix_inclusive_sum",
        "simd_prefix_exclusive_sum", "simd_prefix_inclusive_product",
        "simd_prefix_exclusive_product", "simd_all", "simd_any", "simd_ballot", "simd_is_first"};
    return op >= 0 && op < (int)(sizeof names / sizeof *names) ? names[op] : "simd collective";
}


const char* describe(const Fiber& f, char* buf, size_t n) {
    if (f.state == kDone) snprintf(buf, n, "had returned");
    else if (f.state == kAtBarrier) snprintf(buf, n, "waited at threadgroup_barrier (line %d)", f.line);
    else snprintf(buf, n, "waited at %s (line %d)", op_name(f.op), f.line);
    return buf;
}

void run_threadgroup_fibers(const Launch* L, unsigned tg, unsigned n, Rng& rng) {
    const unsigned n_sg = (n + kSimdWidth - 1) / kSimdWidth;
    for (unsigned i = 0; i < n; ++i) {
        Fiber& f = g_fibers[i];
        f.state = kReady;
        f.line = f.op = 0;
        f.collectives = 0;
        f.th = Thread{tg * L->tg_size + i, i, tg, i % kSimdWidth, i / kSimdWidth, 0, n,
                      lanes_of(n, i / kSimdWidth)};
        start_fiber(i);
    }
    if (n % kSimdWidth) {
        // The lanes a short SIMD-group lacks: their collective slots hold NaN (0x7FC0 as
        // halves too), what a collective reading them returns.
        for (unsigned parity = 0; parity < 2; ++parity)
            for (unsigned l = n % kSimdWidth; l < kSimdWidth; ++l) {
                uint32_t* p = (uint32_t*)(g_slots + ((size_t)((n_sg - 1) * 2 + parity) * kSimdWidth + l) * kSlotBytes);
                for (unsigned w = 0; w < kSlotBytes / 4; ++w) p[w] = 0x7FC07FC0u;
            }
    }
    for (;;) {
        // Sweep: run every ready fiber until it parks or returns.
        make_order(g_sg_order, n_sg, L->schedule, rng);
        for (unsigned s = 0; s < n_sg; ++s) {
            const unsigned width = lanes_of(n, g_sg_order[s]);
            for (unsigned l = 0; l < width; ++l) {
                unsigned lane = L->schedule == kReverse ? width - 1 - l : l;
                Fiber* f = &g_fibers[g_sg_order[s] * kSimdWidth + lane];
                if (f->state == kReady) resume(f);
            }
        }
        // Release SIMD-groups whose lanes all wait at the same collective.
        bool released = false;
        for (unsigned s = 0; s < n_sg; ++s) {
            Fiber* lanes = &g_fibers[s * kSimdWidth];
            const unsigned width = lanes_of(n, s);
            unsigned at = 0, first = width;
            for (unsigned l = 0; l < width; ++l)
                if (lanes[l].state == kAtSimd) { ++at; if (first == width) first = l; }
            if (!at) continue;
            for (unsigned l = 0; l < width; ++l) {
                const Fiber& a = lanes[first];
                const Fiber& b = lanes[l];
                if (b.state != kAtSimd || b.op != a.op || b.line != a.line) {
                    char da[128], db[128];
                    fail_message(
                        "divergent SIMD collective in threadgroup %u, SIMD-group %u: lane %u %s "
                        "but lane %u %s; every lane of a SIMD-group must call the same "
                        "collective (%u of %u lanes were there)",
                        tg, s, first, describe(a, da, sizeof da), l, describe(b, db, sizeof db), at,
                        width);
                }
            }
            for (unsigned l = 0; l < width; ++l) lanes[l].state = kReady;
            released = true;
        }
        if (released) continue;
        unsigned done = 0, waiting = 0, first_done = n, first_wait = n;
        for (unsigned i = 0; i < n; ++i) {
            if (g_fibers[i].state == kDone) { ++done; if (first_done == n) first_done = i; }
            else { ++waiting; if (first_wait == n) first_wait = i; }
        }
        if (done == n) return;
        if (done)
            fail_message(
                "threadgroup_barrier (line %d) was reached by %u of %u threads of threadgroup %u; "
                "thread %u of the threadgroup returned without reaching it (a return before a "
                "barrier is allowed only when the whole threadgroup returns)",
                g_fibers[first_wait].line, waiting, n, tg, first_done);
        for (unsigned i = 0; i < n; ++i)
            if (g_fibers[i].line != g_fibers[first_wait].line)
                fail_message(
                    "threads of threadgroup %u wait at different barriers: thread %u at line %d, "
                    "thread %u at line %d; every thread must reach the same threadgroup_barrier",
                    tg, first_wait, g_fibers[first_wait].line, i, g_fibers[i].line);
        for (unsigned i = 0; i < n; ++i) g_fibers[i].state = kReady;
    }
}

}  // namespace

// ----------------------------------------------------------------------------- kernel-facing API
extern "C" {

void __emu_fail(const char* msg) { fail_message("%s", msg); }

void* __emu_tg_alloc(unsigned size, unsigned align) {
    Thread* t = __emu_cur;
    if (align < 16) align = 16;
    unsigned off = (t->tg_off + align - 1) / align * align;
    unsigned long end = (unsigned long)off + size;
    if (end > kThreadgroupMemory)
        fail_message(
            "the kernel's threadgroup arrays need at least %lu bytes; Metal allows at most %d "
            "bytes of threadgroup memory per threadgroup", end, (int)kThreadgroupMemory);
    t->tg_off = (unsigned)end;
    if (end > g_poisoned) {
        // Poison with a quiet NaN that is also a NaN as two halves (0x7FC0): reading memory no
        // thread of this threadgroup wrote yields NaN, which a comparison with NumPy exposes.
        uint32_t* p = (uint32_t*)(g_arena + (g_poisoned & ~3u));
        uint32_t* q = (uint32_t*)(g_arena + ((end + 3) & ~3ul));
        while (p < q) *p++ = 0x7FC07FC0u;
        g_poisoned = (unsigned)end;
        if (end > g_high_water) g_high_water = (unsigned)end;
    }
    return g_arena + off;
}

void __emu_barrier(int line, int op) {
    if (!g_running)
        fail_message("internal: %s (line %d) called on the barrier-free path; the loader did "
                     "not see that this kernel synchronises", op_name(op), line);
    Fiber* f = g_running;
    f->state = kAtBarrier;
    f->line = line;
    f->op = op;
    park(f);
}

const char* __emu_simd_gather(int line, int op, const void* value, unsigned size) {
    if (!g_running)
        fail_message("internal: %s (line %d) called on the barrier-free path; the loader did "
                     "not see that this kernel synchronises", op_name(op), line);
    Fiber* f = g_running;
    // Two slot sets alternate so that a lane that has read collective k and raced ahead to
    // collective k+1 cannot overwrite values a slower lane has not read yet.
    char* slots = g_slots + ((size_t)(f->th.sg * 2 + (f->collectives & 1)) * kSimdWidth) * kSlotBytes;
    if (size) memcpy(slots + (size_t)f->th.lane * kSlotBytes, value, size);
    ++f->collectives;
    f->state = kAtSimd;
    f->line = line;
    f->op = op;
    park(f);
    return slots;
}

int __emu_dispatch(const Launch* L, Outcome* out, ThreadFn thread_fn, SimdgroupFn simdgroup_fn,
                   int needs_fibers) {
    g_out = out;
    out->code = kOk;
    out->msg[0] = 0;
    __emu_launch = L;
    g_thread_fn = thread_fn;
    g_running = nullptr;
    g_high_water = 0;
    ensure_arena();
    if (needs_fibers) ensure_fibers(L->tg_size);
    unsigned* tg_order = (unsigned*)malloc(sizeof(unsigned) * (L->n_tg ? L->n_tg : 1));
    unsigned sg_order[1024 / kSimdWidth];
    Rng rng{L->seed * 0x2545F4914F6CDD1Dull + 1};
    make_order(tg_order, L->n_tg, L->schedule, rng);
    Thread th{};
    volatile unsigned current_tg = 0;
    install_handlers();
    t_in_dispatch = 1;
    if (sigsetjmp(g_jump, 1) == 0) {
        for (unsigned k = 0; k < L->n_tg; ++k) {
            unsigned tg = tg_order[k];
            current_tg = tg;
            g_poisoned = 0;
            const unsigned n = threads_of(L, tg);
            if (!n) continue;
            if (needs_fibers) {
                run_threadgroup_fibers(L, tg, n, rng);
                g_running = nullptr;
            } else {
                const unsigned n_sg = (n + kSimdWidth - 1) / kSimdWidth;
                make_order(sg_order, n_sg, L->schedule, rng);
                for (unsigned s = 0; s < n_sg; ++s) {
                    th.tgid = tg;
                    th.sg = sg_order[s];
                    th.tg_n = n;
                    th.sg_n = lanes_of(n, th.sg);
                    __emu_cur = &th;
                    simdgroup_fn(L, &th);
                }
            }
        }
    }
    t_in_dispatch = 0;
    restore_handlers();
    if (out->code == kSignal) {
        const char* where = "";
        char* a = (char*)out->fault_addr;
        if (a >= g_arena + kThreadgroupMemory && a < g_arena + kThreadgroupMemory + g_page)
            where = "past the end of threadgroup memory (32768 bytes); ";
        else if (g_stacks && a >= g_stacks && a < g_stacks + (size_t)g_fiber_capacity * (kStackBytes + g_page) &&
                 (size_t)(a - g_stacks) % (kStackBytes + g_page) < (size_t)g_page)
            where = "stack overflow of a GPU thread (each has a 64 KiB stack here); ";
        snprintf(out->msg, sizeof out->msg, "%sGPU thread %u (threadgroup %u)", where,
                 __emu_cur ? __emu_cur->gid : 0u, (unsigned)current_tg);
    }
    g_running = nullptr;
    __emu_cur = nullptr;
    free(tg_order);
    out->tg_memory = g_high_water;
    out->tg_failed = current_tg;
    return out->code;
}

}  // extern "C"
