/* The block scheduler of the HOST build (contract in host_exec.h): fibers,
 * the block and warp collectives, the schedule order, the grid runner. */
#include "host_exec.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include "mlk_host.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define MLK_HOST_ASAN 1
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace mlk_host {

__thread const coords *cur;

namespace {

#ifdef MLK_HOST_ASAN
/* Sanitizer frames are several times larger. */
constexpr size_t STACK_BYTES = (size_t)1 << 20;
#else
constexpr size_t STACK_BYTES = (size_t)256 << 10;
#endif
constexpr unsigned MAX_BLOCK_THREADS = 1024;
constexpr unsigned MAX_BLOCK_Z = 64;
constexpr unsigned MAX_GRID_YZ = 65535;
constexpr size_t GATHER_MAX = 64;
constexpr size_t SMEM_ALIGN = 16;
/* Fiber i's stack starts (i % STACK_COLOURS) * STACK_COLOUR_BYTES below its
 * mapping's top: equally aligned stack tops would all fall in the same cache
 * sets, and switching among them would thrash the caches. */
constexpr unsigned STACK_COLOURS = 64;
constexpr size_t STACK_COLOUR_BYTES = 64 + 16;
/* Dynamic shared memory starts as this byte in every block (all-ones f32 and
 * bf16 are NaNs), so a read before the block's first write shows. */
constexpr int SMEM_POISON = 0xff;

/* ---- contexts: a minimal switch on x86-64 (callee-saved registers and the
 * stack pointer; the SSE and x87 control words are the thread's, never changed
 * by a kernel, so not switched), ucontext elsewhere ------------------------------ */

#if defined(__x86_64__)
extern "C" void mlk_host_switch(void **save_sp, void *to_sp);
extern "C" void mlk_host_fiber_start(void);
asm(R"(
    .text
    .globl mlk_host_switch
    .type mlk_host_switch, @function
mlk_host_switch:
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
    .size mlk_host_switch, .-mlk_host_switch

    .globl mlk_host_fiber_start
    .type mlk_host_fiber_start, @function
mlk_host_fiber_start:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size mlk_host_fiber_start, .-mlk_host_fiber_start
)");

struct context {
    void *sp;
};

/* A fresh context that calls entry(arg) on [stack, stack + size). */
void context_init(context *c, char *stack, size_t size, void (*entry)(void *), void *arg)
{
    /* mlk_host_switch's frame, read upwards from sp: r15, r14, r13, r12,
     * rbx, rbp, return address; after its ret the stack is 16-byte
     * aligned, as the trampoline's call needs. */
    uintptr_t top = ((uintptr_t)(stack + size) & ~(uintptr_t)15) - 16;
    uint64_t *frame = (uint64_t *)top - 7;
    frame[0] = 0;                   /* r15 */
    frame[1] = 0;                   /* r14 */
    frame[2] = (uint64_t)entry;     /* r13 */
    frame[3] = (uint64_t)arg;       /* r12 */
    frame[4] = 0;                   /* rbx */
    frame[5] = 0;                   /* rbp */
    frame[6] = (uint64_t)&mlk_host_fiber_start;
    c->sp = frame;
}

void context_switch(context *from, context *to)
{
    mlk_host_switch(&from->sp, to->sp);
}
#else
struct context {
    ucontext_t uc;
};

/* makecontext passes int arguments: the two pointers in halves. */
void context_trampoline(unsigned entry_lo, unsigned entry_hi, unsigned arg_lo, unsigned arg_hi)
{
    void (*entry)(void *) = (void (*)(void *))(uintptr_t)((uint64_t)entry_hi << 32 | entry_lo);
    entry((void *)(uintptr_t)((uint64_t)arg_hi << 32 | arg_lo));
    abort();
}

void context_init(context *c, char *stack, size_t size, void (*entry)(void *), void *arg)
{
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = nullptr;
    const uint64_t e = (uint64_t)(uintptr_t)entry, a = (uint64_t)(uintptr_t)arg;
    makecontext(&c->uc, (void (*)())context_trampoline, 4, (unsigned)e, (unsigned)(e >> 32),
                (unsigned)a, (unsigned)(a >> 32));
}

void context_switch(context *from, context *to)
{
    swapcontext(&from->uc, &to->uc);
}
#endif

/* ---- fibers and the block being run ------------------------------------------------ */

enum fiber_state { FIBER_RUNNABLE, FIBER_AT_BARRIER, FIBER_AT_WARP, FIBER_EXITED };

struct fiber {
    coords c;
    unsigned warp;
    fiber_state state;
    const void *contribution; /* borrowed: the value at its pending warp collective */
    context ctx;
    char *stack;              /* owned: mmap'd, lowest page a guard */
};

struct warp_state {
    unsigned pending; /* mask of the collective in progress; 0: none */
    unsigned arrived;
    unsigned exited;
    size_t size;
    alignas(16) unsigned char slots[MLK_HOST_WARP * GATHER_MAX];
};

/* One per host thread that runs grids; reused by every block. */
struct runner {
    std::vector<std::unique_ptr<fiber>> fibers; /* grown to the largest block seen */
    std::vector<warp_state> warps;
    unsigned n_threads = 0, n_exited = 0, n_at_barrier = 0;
    fiber *running = nullptr;
    context sched;
    const std::function<void()> *thread_fn = nullptr;
    void *dyn_smem = nullptr;
    size_t dyn_smem_bytes = 0;
    uint3 block_idx;
    uint64_t rng = 0;
    uint64_t launches = 0;
    /* The pass: the fibers runnable when it began, in schedule order, and
     * the one running. */
    std::vector<unsigned> pass;
    size_t pass_pos = 0;
#ifdef MLK_HOST_ASAN
    const void *sched_bottom = nullptr; /* the host thread's stack */
    size_t sched_size = 0;
    bool from_sched = false;            /* the last switch left the scheduler */
#endif
    ~runner()
    {
        for (auto &f : fibers)
            munmap(f->stack, STACK_BYTES);
    }
};

thread_local runner *tl_runner;

#ifdef MLK_HOST_ASAN
/* Tell ASan the switch into this context is complete; the first switch
 * out of the scheduler also tells where its stack is. */
void sanitizer_arrived(runner &r, void *fake)
{
    const void *bottom = nullptr;
    size_t size = 0;
    __sanitizer_finish_switch_fiber(fake, &bottom, &size);
    if (r.from_sched) {
        r.sched_bottom = bottom;
        r.sched_size = size;
    }
}
#endif

runner &this_runner()
{
    static thread_local runner r;
    tl_runner = &r;
    return r;
}

[[noreturn]] void fail(const char *what)
{
    const runner *r = tl_runner;
    const fiber *f = r ? r->running : nullptr;
    fprintf(stderr, "mlk host: %s", what);
    if (r)
        fprintf(stderr, " (block %u,%u,%u", r->block_idx.x, r->block_idx.y, r->block_idx.z);
    if (f)
        fprintf(stderr, ", thread %u,%u,%u", f->c.thread_idx.x, f->c.thread_idx.y,
                f->c.thread_idx.z);
    if (r)
        fprintf(stderr, ")");
    fprintf(stderr, "\n");
    abort();
}

/* Switch from `from` (the running fiber's context or the scheduler's) to
 * fiber `to`, or to the scheduler when to is NULL; returns when something
 * switches back. */
void switch_to(runner &r, context *from, fiber *to)
{
    r.running = to;
    cur = to ? &to->c : nullptr;
#ifdef MLK_HOST_ASAN
    void *fake = nullptr;
    r.from_sched = from == &r.sched;
    if (to)
        __sanitizer_start_switch_fiber(&fake, to->stack, STACK_BYTES);
    else
        __sanitizer_start_switch_fiber(&fake, r.sched_bottom, r.sched_size);
#endif
    context_switch(from, to ? &to->ctx : &r.sched);
#ifdef MLK_HOST_ASAN
    sanitizer_arrived(r, fake);
#endif
}

/* The running fiber is done until a collective releases it: on to the next
 * fiber of the pass, straight (half the switches of going through the
 * scheduler), or back to the scheduler after the pass's last. */
void yield()
{
    runner &r = *tl_runner;
    fiber *f = r.running;
    fiber *next = ++r.pass_pos < r.pass.size() ? r.fibers[r.pass[r.pass_pos]].get() : nullptr;
    switch_to(r, &f->ctx, next);
}

void release_barrier(runner &r)
{
    for (unsigned t = 0; t < r.n_threads; t++)
        if (r.fibers[t]->state == FIBER_AT_BARRIER)
            r.fibers[t]->state = FIBER_RUNNABLE;
    r.n_at_barrier = 0;
}

void thread_exited(runner &r, fiber *f)
{
    warp_state &w = r.warps[f->warp];
    const unsigned bit = 1u << f->c.lane;
    if (w.pending & bit)
        fail("a thread exited while its warp waits for it in a collective");
    w.exited |= bit;
    f->state = FIBER_EXITED;
    r.n_exited++;
    if (r.n_at_barrier && r.n_at_barrier == r.n_threads - r.n_exited)
        release_barrier(r);
}

/* A fiber's whole life: run the kernel's thread once per block. */
void fiber_main(void *arg)
{
    fiber *f = (fiber *)arg;
    runner &r = *tl_runner;
#ifdef MLK_HOST_ASAN
    sanitizer_arrived(r, nullptr);
#endif
    for (;;) {
        (*r.thread_fn)();
        thread_exited(r, f);
        yield();
    }
}

fiber *fiber_new(unsigned index)
{
    char *stack = (char *)mmap(nullptr, STACK_BYTES, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (stack == MAP_FAILED)
        fail("out of memory for fiber stacks");
    mprotect(stack, (size_t)sysconf(_SC_PAGESIZE), PROT_NONE);
#ifdef MLK_HOST_ASAN
    /* The mapping may reuse the addresses of an exited thread's stack, whose
     * frames' redzones ASan's shadow still marks: fresh memory has none. */
    ASAN_UNPOISON_MEMORY_REGION(stack, STACK_BYTES);
#endif
    fiber *f = new fiber();
    f->stack = stack;
    context_init(&f->ctx, stack, STACK_BYTES - index % STACK_COLOURS * STACK_COLOUR_BYTES,
                 fiber_main, f);
    return f;
}

/* ---- schedule order -------------------------------------------------------------- */

std::atomic<int> g_order{-1}; /* -1: not read from the environment yet */
std::atomic<uint64_t> g_seed{1};

int schedule_order()
{
    int order = g_order.load(std::memory_order_relaxed);
    if (order >= 0)
        return order;
    order = MLK_HOST_SCHEDULE_FORWARD;
    const char *env = getenv("MLK_HOST_SCHEDULE");
    if (env && !strcmp(env, "reverse"))
        order = MLK_HOST_SCHEDULE_REVERSE;
    else if (env && !strncmp(env, "shuffle", 7)) {
        order = MLK_HOST_SCHEDULE_SHUFFLE;
        if (env[7] == ':')
            g_seed.store(strtoull(env + 8, nullptr, 10), std::memory_order_relaxed);
    } else if (env && *env && strcmp(env, "forward"))
        fprintf(stderr, "mlk host: MLK_HOST_SCHEDULE=%s: expected forward, reverse or "
                        "shuffle[:seed]; using forward\n", env);
    int expected = -1;
    g_order.compare_exchange_strong(expected, order);
    return g_order.load(std::memory_order_relaxed);
}

uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void apply_order(runner &r, int order, std::vector<unsigned> &v)
{
    if (order == MLK_HOST_SCHEDULE_REVERSE)
        std::reverse(v.begin(), v.end());
    else if (order == MLK_HOST_SCHEDULE_SHUFFLE)
        for (size_t i = v.size(); i > 1; i--)
            std::swap(v[i - 1], v[splitmix64(&r.rng) % i]);
}

/* ---- one block ------------------------------------------------------------------- */

[[noreturn]] void deadlock(runner &r)
{
    unsigned at_barrier = 0, at_warp = 0;
    for (unsigned t = 0; t < r.n_threads; t++) {
        at_barrier += r.fibers[t]->state == FIBER_AT_BARRIER;
        at_warp += r.fibers[t]->state == FIBER_AT_WARP;
    }
    char msg[200];
    snprintf(msg, sizeof msg,
             "deadlock: %u threads at __syncthreads, %u at warp collectives, %u exited of %u",
             at_barrier, at_warp, r.n_exited, r.n_threads);
    fail(msg);
}

void run_block(runner &r, const launch_config &cfg, uint3 block_idx, int order)
{
    const unsigned n = cfg.block.x * cfg.block.y * cfg.block.z;
    r.block_idx = block_idx;
    r.n_threads = n;
    r.n_exited = 0;
    r.n_at_barrier = 0;
    const unsigned n_warps = (n + MLK_HOST_WARP - 1) / MLK_HOST_WARP;
    for (unsigned w = 0; w < n_warps; w++) {
        r.warps[w].pending = r.warps[w].arrived = r.warps[w].exited = 0;
    }
    for (unsigned t = 0; t < n; t++) {
        fiber *f = r.fibers[t].get();
        f->c.thread_idx = make_uint3(t % cfg.block.x, t / cfg.block.x % cfg.block.y,
                                     t / (cfg.block.x * cfg.block.y));
        f->c.block_idx = block_idx;
        f->c.block_dim = cfg.block;
        f->c.grid_dim = cfg.grid;
        f->c.lane = t % MLK_HOST_WARP;
        f->c.warp_lanes = std::min((unsigned)MLK_HOST_WARP, n - t / MLK_HOST_WARP * MLK_HOST_WARP);
        f->warp = t / MLK_HOST_WARP;
        f->state = FIBER_RUNNABLE;
    }
    if (r.dyn_smem)
        memset(r.dyn_smem, SMEM_POISON, r.dyn_smem_bytes);
    while (r.n_exited < n) {
        r.pass.clear();
        for (unsigned t = 0; t < n; t++)
            if (r.fibers[t]->state == FIBER_RUNNABLE)
                r.pass.push_back(t);
        if (r.pass.empty())
            deadlock(r);
        apply_order(r, order, r.pass);
        r.pass_pos = 0;
        switch_to(r, &r.sched, r.fibers[r.pass[0]].get());
    }
}

} /* namespace */

/* ---- the collectives --------------------------------------------------------------- */

void syncthreads()
{
    runner &r = *tl_runner;
    fiber *f = r.running;
    f->state = FIBER_AT_BARRIER;
    if (++r.n_at_barrier == r.n_threads - r.n_exited)
        release_barrier(r);
    yield();
}

const unsigned char *warp_gather(unsigned mask, const void *mine, size_t size)
{
    return warp_gather_finish(mask, mine, size, nullptr, nullptr);
}

const unsigned char *warp_gather_finish(unsigned mask, const void *mine, size_t size,
                                        void (*finish)(void *ctx, unsigned char *slots),
                                        void *ctx)
{
    runner &r = *tl_runner;
    fiber *f = r.running;
    warp_state &w = r.warps[f->warp];
    const unsigned bit = 1u << f->c.lane;
    const unsigned lanes =
        f->c.warp_lanes == MLK_HOST_WARP ? ~0u : (1u << f->c.warp_lanes) - 1u;
    if (!(mask & bit))
        fail("warp collective whose mask leaves out the calling lane");
    if (mask & ~lanes)
        fail("warp collective whose mask names lanes the block does not have");
    if (mask & w.exited)
        fail("warp collective whose mask names an exited lane");
    if (size > GATHER_MAX)
        fail("warp collective over a value larger than the exchange holds");
    if (!w.pending) {
        w.pending = mask;
        w.size = size;
        w.arrived = 0;
    } else if (w.pending != mask || w.size != size) {
        fail("two different warp collectives in progress in one warp");
    }
    w.arrived |= bit;
    f->contribution = mine;
    f->state = FIBER_AT_WARP;
    if (w.arrived == mask) {
        memset(w.slots, 0, MLK_HOST_WARP * size);
        for (unsigned i = 0; i < MLK_HOST_WARP; i++)
            if (mask >> i & 1u) {
                fiber *peer = r.fibers[f->warp * MLK_HOST_WARP + i].get();
                if (size)
                    memcpy(w.slots + i * size, peer->contribution, size);
                peer->state = FIBER_RUNNABLE;
            }
        w.pending = 0;
        if (finish)
            finish(ctx, w.slots);
    }
    yield();
    return w.slots;
}

unsigned active_mask()
{
    const runner &r = *tl_runner;
    const fiber *f = r.running;
    const unsigned lanes =
        f->c.warp_lanes == MLK_HOST_WARP ? ~0u : (1u << f->c.warp_lanes) - 1u;
    return lanes & ~r.warps[f->warp].exited;
}

void *dynamic_smem()
{
    return tl_runner->dyn_smem;
}

/* ---- grids --------------------------------------------------------------------------- */

cudaError_t launch_check(const launch_config &cfg)
{
    const dim3 b = cfg.block, g = cfg.grid;
    if (!b.x || !b.y || !b.z || b.x > MAX_BLOCK_THREADS || b.y > MAX_BLOCK_THREADS ||
        b.z > MAX_BLOCK_Z || (uint64_t)b.x * b.y * b.z > MAX_BLOCK_THREADS)
        return cudaErrorInvalidConfiguration;
    if (!g.x || !g.y || !g.z || g.x > INT32_MAX || g.y > MAX_GRID_YZ || g.z > MAX_GRID_YZ)
        return cudaErrorInvalidConfiguration;
    if (cfg.smem > max_dynamic_smem(cfg.func))
        return cudaErrorInvalidValue;
    return cudaSuccess;
}

void run_grid(const launch_config &cfg, const std::function<void()> &thread)
{
    runner &r = this_runner();
    if (r.running)
        fail("a grid launched from inside a kernel");
    const unsigned n = cfg.block.x * cfg.block.y * cfg.block.z;
    while (r.fibers.size() < n)
        r.fibers.emplace_back(fiber_new((unsigned)r.fibers.size()));
    if (r.warps.size() < (n + MLK_HOST_WARP - 1) / MLK_HOST_WARP)
        r.warps.resize((n + MLK_HOST_WARP - 1) / MLK_HOST_WARP);
    const int order = schedule_order();
    r.rng = g_seed.load(std::memory_order_relaxed) ^ (r.launches++ * 0x9e3779b97f4a7c15ull);
    r.thread_fn = &thread;
    r.dyn_smem_bytes = cfg.smem;
    r.dyn_smem = nullptr;
    const size_t smem_rounded = (cfg.smem + SMEM_ALIGN - 1) / SMEM_ALIGN * SMEM_ALIGN;
    if (cfg.smem && posix_memalign(&r.dyn_smem, SMEM_ALIGN, smem_rounded))
        fail("out of memory for dynamic shared memory");

    const uint64_t n_blocks = (uint64_t)cfg.grid.x * cfg.grid.y * cfg.grid.z;
    std::vector<unsigned> blocks;
    if (order != MLK_HOST_SCHEDULE_FORWARD) {
        blocks.resize(n_blocks);
        for (uint64_t i = 0; i < n_blocks; i++)
            blocks[i] = (unsigned)i;
        apply_order(r, order, blocks);
    }
    for (uint64_t i = 0; i < n_blocks; i++) {
        const uint64_t id = blocks.empty() ? i : blocks[i];
        run_block(r, cfg,
                  make_uint3((unsigned)(id % cfg.grid.x), (unsigned)(id / cfg.grid.x % cfg.grid.y),
                             (unsigned)(id / ((uint64_t)cfg.grid.x * cfg.grid.y))),
                  order);
    }
    free(r.dyn_smem);
    r.dyn_smem = nullptr;
    r.thread_fn = nullptr;
}

} /* namespace mlk_host */

extern "C" void mlk_host_schedule_set(int order, unsigned long long seed)
{
    mlk_host::schedule_order(); /* the environment is read once, then overridden */
    mlk_host::g_seed.store(seed, std::memory_order_relaxed);
    mlk_host::g_order.store(order, std::memory_order_relaxed);
}
