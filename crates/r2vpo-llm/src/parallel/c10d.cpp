// torch.distributed's C++ layer (c10d) for the distributed learner: a
// TCPStore rendezvous (hosted by rank 0, or by torchrun's agent) and Gloo
// process groups over it (and, built with R2VPO_NCCL, NCCL process groups
// for CUDA tensors), called from Rust (src/dist/c10d.rs).
//
// Everything here is what libtorch exports; nothing is a collective of our
// own. Gloo objects are only held through the shared_ptr/intrusive_ptr
// libtorch hands out, so the Gloo headers (Debian's libgloo-dev, not the
// commit libtorch was built with) only have to declare, never lay out, a
// Gloo type: see docs/decisions.md, "c10d from Rust".
//
// Every function returns 0 (or a handle), or 1 (or null) with the C++
// exception's message in `err`; no exception crosses into Rust.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef R2VPO_NCCL
// Needs nccl.h and the CUDA headers ATen's CUDA context includes (cuBLAS,
// cuSPARSE, cuSOLVER): deps-gpu.toml fetches them into .deps/cuda.
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <ATen/Version.h>
#include <c10/util/Logging.h>
#include <torch/headeronly/version.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <tuple>
#include <vector>

namespace {

struct StoreHandle {
    c10::intrusive_ptr<c10d::Store> store;
    int port;
};

struct GroupHandle {
    c10::intrusive_ptr<c10d::Backend> backend;
    std::chrono::milliseconds timeout;
};

void fail(char *err, int err_len, const char *what) {
    std::strncpy(err, what, err_len - 1);
    err[err_len - 1] = 0;
}

template <class F>
int guarded(char *err, int err_len, F f) {
    try {
        f();
        return 0;
    } catch (const std::exception &e) {
        fail(err, err_len, e.what());
        return 1;
    } catch (...) {
        fail(err, err_len, "unknown C++ exception");
        return 1;
    }
}

}  // namespace

// Sets libtorch's log threshold (c10's FLAGS_caffe2_log_level: 0 INFO,
// 1 WARNING, 2 ERROR, 3 FATAL), which c10d's own messages obey too.
extern "C" void r2vpo_c10d_log_level(int level) { FLAGS_caffe2_log_level = level; }

// The libtorch this shim was compiled against (its headers' version, as
// "MAJOR.MINOR.PATCH") and the build description of the libtorch loaded
// at run time (at::show_config, whose build settings carry
// TORCH_VERSION), each copied into its buffer, NUL-terminated.
extern "C" void r2vpo_c10d_torch_versions(char *compiled, int compiled_len, char *runtime, int runtime_len) {
    std::string c = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
                    std::to_string(TORCH_VERSION_PATCH);
    std::string r;
    try {
        r = at::show_config();
    } catch (const std::exception &e) {
        r = std::string("at::show_config failed: ") + e.what();
    }
    for (auto [s, buf, len] : {std::tuple{&c, compiled, compiled_len}, std::tuple{&r, runtime, runtime_len}}) {
        if (len <= 0) continue;
        size_t n = std::min(s->size(), static_cast<size_t>(len - 1));
        std::memcpy(buf, s->data(), n);
        buf[n] = 0;
    }
}

// A TCPStore at host:port: its server when `is_server`, else a client.
// With `world` > 0 it counts itself among `world` workers, and a server
// waits until that many have counted themselves in (rank 0's store); with
// 0 it neither counts nor waits (torchrun's agent's store). `port` 0 lets a server
// pick a free port (r2vpo_c10d_store_port). Keys go under `prefix` when it
// is not empty (torchrun's "/worker/attempt_N").
extern "C" void *r2vpo_c10d_store(const char *host, int port, int is_server, int world, long long timeout_ms,
                                  const char *prefix, char *err, int err_len) {
    StoreHandle *h = nullptr;
    guarded(err, err_len, [&] {
        c10d::TCPStoreOptions o;
        o.port = static_cast<uint16_t>(port);
        o.isServer = is_server != 0;
        if (world > 0) o.numWorkers = world;
        o.waitWorkers = world > 0;
        o.timeout = std::chrono::milliseconds(timeout_ms);
        o.multiTenant = is_server != 0;
        auto tcp = c10::make_intrusive<c10d::TCPStore>(std::string(host), o);
        int bound = tcp->getPort();
        c10::intrusive_ptr<c10d::Store> s = tcp;
        if (prefix && *prefix) s = c10::make_intrusive<c10d::PrefixStore>(std::string(prefix), s);
        h = new StoreHandle{s, bound};
    });
    return h;
}

extern "C" int r2vpo_c10d_store_port(void *store) { return static_cast<StoreHandle *>(store)->port; }

extern "C" void r2vpo_c10d_store_drop(void *store) { delete static_cast<StoreHandle *>(store); }

extern "C" int r2vpo_c10d_store_set(void *store, const char *key, const unsigned char *data, size_t len, char *err,
                                    int err_len) {
    return guarded(err, err_len, [&] {
        std::vector<uint8_t> v(data, data + len);
        static_cast<StoreHandle *>(store)->store->set(std::string(key), v);
    });
}

// The value at `key`, waiting for it up to the store's timeout; written to
// a malloc'd buffer the caller frees with r2vpo_c10d_free.
extern "C" int r2vpo_c10d_store_get(void *store, const char *key, unsigned char **out, size_t *out_len, char *err,
                                    int err_len) {
    return guarded(err, err_len, [&] {
        auto v = static_cast<StoreHandle *>(store)->store->get(std::string(key));
        *out_len = v.size();
        *out = static_cast<unsigned char *>(std::malloc(v.empty() ? 1 : v.size()));
        if (!v.empty()) std::memcpy(*out, v.data(), v.size());
    });
}

extern "C" void r2vpo_c10d_free(void *p) { std::free(p); }

// A process group of `world` ranks over `store` (under the key prefix
// `name`, so several groups share one store) on `engine`: 0 Gloo, for CPU
// tensors, whose collectives fail after `timeout_ms` instead of hanging;
// 1 NCCL, for CUDA tensors (built with R2VPO_NCCL only), libtorch_cuda's
// ProcessGroupNCCL, whose watchdog aborts a collective not finished after
// `timeout_ms` (and with TORCH_NCCL_ASYNC_ERROR_HANDLING's default ends
// the process) and which makes its communicator at the first collective,
// on the device of its tensors.
extern "C" void *r2vpo_c10d_group(void *store, const char *name, int engine, int rank, int world,
                                  long long timeout_ms, char *err, int err_len) {
    GroupHandle *h = nullptr;
    guarded(err, err_len, [&] {
        auto timeout = std::chrono::milliseconds(timeout_ms);
        auto s = c10::make_intrusive<c10d::PrefixStore>(std::string(name), static_cast<StoreHandle *>(store)->store);
        c10::intrusive_ptr<c10d::Backend> pg;
        if (engine == 0) {
            auto opts = c10d::ProcessGroupGloo::Options::create_default(timeout);
            pg = c10::make_intrusive<c10d::ProcessGroupGloo>(s, rank, world, opts);
        } else if (engine == 1) {
#ifdef R2VPO_NCCL
            auto opts = c10d::ProcessGroupNCCL::Options::create();
            opts->timeout = timeout;
            pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(s, rank, world, opts);
#else
            throw std::invalid_argument(
                "CUDA tensors need NCCL, and this r2vpo was built without it: build it with `make build-gpu` (the "
                "nccl feature)");
#endif
        } else {
            throw std::invalid_argument("unknown engine " + std::to_string(engine));
        }
        h = new GroupHandle{pg, timeout};
    });
    return h;
}

extern "C" void r2vpo_c10d_group_drop(void *group) { delete static_cast<GroupHandle *>(group); }

// One collective on tch tensor handles (`torch::Tensor *`), waited for:
// 0 all-reduce (sum) of `a` in place; 1 broadcast of `a` from `root`;
// 2 all-gather of `b` into `a` (a = world × b); 3 reduce-scatter (sum) of
// `b` into `a` (b = world × a); 4 barrier; 5 reduce (sum) of `a` into
// `root`'s `a` (the others' `a` is left undefined by c10d).
extern "C" int r2vpo_c10d_collective(void *group, int op, at::Tensor *a, at::Tensor *b, int root, char *err,
                                     int err_len) {
    return guarded(err, err_len, [&] {
        auto *g = static_cast<GroupHandle *>(group);
        c10::intrusive_ptr<c10d::Work> work;
        switch (op) {
            case 0: {
                std::vector<at::Tensor> t{*a};
                work = g->backend->allreduce(t, c10d::AllreduceOptions{});
                break;
            }
            case 1: {
                std::vector<at::Tensor> t{*a};
                c10d::BroadcastOptions o;
                o.rootRank = root;
                work = g->backend->broadcast(t, o);
                break;
            }
            case 2:
                work = g->backend->_allgather_base(*a, *b, c10d::AllgatherOptions{});
                break;
            case 3:
                work = g->backend->_reduce_scatter_base(*a, *b, c10d::ReduceScatterOptions{});
                break;
            case 4:
                work = g->backend->barrier(c10d::BarrierOptions{});
                break;
            case 5: {
                std::vector<at::Tensor> t{*a};
                c10d::ReduceOptions o;
                o.rootRank = root;
                work = g->backend->reduce(t, o);
                break;
            }
            default:
                throw std::invalid_argument("unknown collective " + std::to_string(op));
        }
        work->wait(g->timeout);
    });
}

// Sets `param`'s accumulated gradient to `grad` (a rank that ran no
// backward this step holds none, yet takes part in the gradient sum).
extern "C" int r2vpo_c10d_set_grad(at::Tensor *param, at::Tensor *grad, char *err, int err_len) {
    return guarded(err, err_len, [&] { param->mutable_grad() = *grad; });
}
