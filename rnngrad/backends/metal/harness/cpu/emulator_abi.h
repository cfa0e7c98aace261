// The interface between a compiled kernel library and the harness runtime.
//
// Both the generated kernel translation unit (through metal_stdlib.h) and
// emulator_runtime.cpp include this file. It includes no system header, so that
// unqualified MSL calls such as `abs(i)` or `exp(x)` never meet a libc overload.
// The Python loader mirrors `Launch` and `Outcome` with ctypes structures.
#pragma once

namespace __emu {

// One GPU thread's builtins, as the kernel sees them (1-D grid).
struct Thread {
    unsigned gid;     // thread_position_in_grid
    unsigned lid;     // thread_position_in_threadgroup
    unsigned tgid;    // threadgroup_position_in_grid
    unsigned lane;    // thread_index_in_simdgroup
    unsigned sg;      // simdgroup_index_in_threadgroup
    unsigned tg_off;  // bytes of threadgroup memory this thread has declared so far
    unsigned tg_n;    // threads_per_threadgroup: threads of this threadgroup
    unsigned sg_n;    // threads_per_simdgroup: lanes of this SIMD-group (32 but in a short one)
};

enum { kMaxBuffers = 31, kSimdWidth = 32, kThreadgroupMemory = 32768 };

enum Schedule { kLanes = 0, kReverse = 1, kAdversarial = 2 };

struct Launch {
    void* bufs[kMaxBuffers];   // [[buffer(i)]], in call order
    unsigned count;            // threads requested by the host
    unsigned tg_size;          // threads per threadgroup (a multiple of 32 unless exact)
    unsigned n_tg;             // threadgroups that run: ceil(count / tg_size), or fewer
    unsigned schedule;         // Schedule
    unsigned long long seed;   // for kAdversarial
    unsigned exact;            // 1: threads past count do not exist (dispatchThreads): the last
                               // threadgroup, and its last SIMD-group, may be short; 0: every
                               // threadgroup is whole (threads past count run)
};

enum Code { kOk = 0, kFailed = 1, kSignal = 2 };

struct Outcome {
    int code;                  // Code
    int signo;                 // for kSignal
    void* fault_addr;          // for kSignal
    unsigned tg_memory;        // high-water threadgroup memory, bytes
    unsigned tg_failed;        // threadgroup running when the dispatch stopped
    char msg[2048];            // for kFailed
};

typedef void (*ThreadFn)(const Launch*, Thread*);
typedef void (*SimdgroupFn)(const Launch*, Thread*);

}  // namespace __emu

extern "C" {
extern __emu::Thread* __emu_cur;
extern const __emu::Launch* __emu_launch;
void* __emu_tg_alloc(unsigned size, unsigned align);
void __emu_barrier(int line, int scope);
const char* __emu_simd_gather(int line, int op, const void* value, unsigned size);
[[noreturn]] void __emu_fail(const char* msg);
int __emu_dispatch(const __emu::Launch* launch, __emu::Outcome* out, __emu::ThreadFn thread_fn,
                   __emu::SimdgroupFn simdgroup_fn, int needs_fibers);
}
