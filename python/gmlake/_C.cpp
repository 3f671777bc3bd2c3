// gmlake._C: PyTorch's CUDA allocator on the lake. A subclass of
// c10::cuda::CUDACachingAllocator::CUDAAllocator (as PyTorch's own
// CUDAMallocAsyncAllocator is), installed the way
// torch.cuda.memory.change_current_allocator installs one. It only
// translates: every decision (placement, stream reuse, private pools, the
// retry before an out-of-memory, counters, history) is libgmlake-client's C
// API (gmlake.h). What stays here is PyTorch's own: DataPtrs, the
// OutOfMemoryError and its observers, Python stacks for memory_viz.
#include <cstdio>
#include <string>
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>
#include <torch/extension.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "gmlake.h"

// Numbers and pointers go into error messages as strings made here: a number streamed by
// TORCH_CHECK (operator<< of long, double, void*) ran this extension's instantiation of
// std::ostream's number formatting on a stream of torch's libstdc++, and a newer compiler's
// instantiation crashed there (a segmentation fault where the error should have been raised:
// a job whose lake could not open, session 14 on the H200).
static std::string gml_num(long long v) { return std::to_string(v); }
static std::string gml_num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}
static std::string gml_ptr(const void *p) {
  char b[32];
  std::snprintf(b, sizeof b, "%p", p);
  return b;
}

#ifndef GMLAKE_NO_IPC
#include "_torch_ipc.h"
#endif

namespace {

using namespace c10::cuda::CUDACachingAllocator;
using c10::CachingDeviceAllocator::BlockInfo;
using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::SegmentInfo;
using c10::CachingDeviceAllocator::TraceEntry;

constexpr int kMaxDevices = 64;

gml_pool_id to_pool(c10::MempoolId_t id) { return gml_pool_id{id.first, id.second}; }

void local_raw_delete(void *ptr);

// A private pool's live set (gml_pool_checkpoint), for cudagraph trees.
struct Checkpoint : AllocatorState {
  c10::MempoolId_t pool;
  gml_pool_ckpt *ckpt = nullptr;
  ~Checkpoint() override { gml_pool_checkpoint_free(ckpt); }
};

class GmlakeAllocator : public CUDAAllocator {
public:
  // ---------- what the C library cannot see: devices, streams, stacks ----------
  gml_client *client(c10::DeviceIndex device) {
    gml_client *c = gml_device_client(device);
    TORCH_CHECK(c, "gmlake: cannot open the lake of device ", gml_num((long long)device),
                " (see the gmlake log line above; GMLAKE_MODE/GMLAKE_SOCKET choose daemon or embedded)");
    std::call_once(opened_[device], [&] {
      if (fraction_[device] > 0) apply_fraction(c, device, fraction_[device]);
      if (history_cap_) gml_trace_enable(c, history_cap_);
    });
    return c;
  }

  gml_client *client_of(const void *ptr, c10::DeviceIndex *dev = nullptr) {
    for (int d = 0; d < kMaxDevices; d++) {
      gml_client *c = gml_device_client_if_open(d);
      if (c && gml_contains(c, ptr)) {
        if (dev) *dev = static_cast<c10::DeviceIndex>(d);
        return c;
      }
    }
    return nullptr;
  }

  uint64_t context_for_alloc() {
    if (!recorder_ || when_ == RecordContext::NEVER) return 0;
    auto ctx = recorder_();
    std::lock_guard<std::mutex> g(ctx_mu_);
    uint64_t tag = ++next_tag_;
    contexts_[tag] = std::move(ctx);
    return tag;
  }

  uint64_t context_for_free() {
    if (!recorder_ || when_ != RecordContext::ALL) return 0;
    return context_for_alloc();
  }

  // Forget contexts that neither a live block nor the history ring refers to.
  void prune_contexts() {
    std::unordered_set<uint64_t> keep;
    for (int d = 0; d < kMaxDevices; d++) {
      gml_client *c = gml_device_client_if_open(d);
      if (!c) continue;
      for (auto &b : blocks(c)) keep.insert(b.tag);
      for (auto &t : trace(c)) keep.insert(t.tag);
    }
    std::lock_guard<std::mutex> g(ctx_mu_);
    for (auto it = contexts_.begin(); it != contexts_.end();)
      it = keep.count(it->first) ? std::next(it) : contexts_.erase(it);
  }

  std::shared_ptr<c10::GatheredContext> context(uint64_t tag) {
    if (!tag) return nullptr;
    std::lock_guard<std::mutex> g(ctx_mu_);
    auto it = contexts_.find(tag);
    return it == contexts_.end() ? nullptr : it->second;
  }

  static std::vector<gml_alloc_info> blocks(gml_client *c) {
    size_t n = 0;
    gml_allocations(c, nullptr, 0, &n);
    std::vector<gml_alloc_info> v(n + 64);
    gml_allocations(c, v.data(), v.size(), &n);
    v.resize(std::min(n, v.size()));
    return v;
  }

  // gml_segments: the segments a snapshot shows (held chunks, each once, at
  // the slot that stands for it) with their blocks, free space included, and
  // the seq of the last history entry they include
  struct Segments {
    std::vector<gml_segment_info> segs;
    std::vector<gml_alloc_info> blocks;
    uint64_t seq = 0;
  };
  static Segments segments(gml_client *c) {
    Segments s;
    size_t ns = 0, nb = 0;
    for (;;) {
      if (gml_segments(c, s.segs.data(), s.segs.size(), &ns, s.blocks.data(), s.blocks.size(), &nb, &s.seq))
        return Segments{};
      if (ns <= s.segs.size() && nb <= s.blocks.size()) break;
      s.segs.resize(ns + 16);
      s.blocks.resize(nb + 256);
    }
    s.segs.resize(ns);
    s.blocks.resize(nb);
    return s;
  }

  static std::vector<gml_trace_entry> trace(gml_client *c) {
    std::vector<gml_trace_entry> v(1 << 16);
    size_t n = 0;
    for (;;) {
      gml_trace_read(c, v.data(), v.size(), &n);
      if (n < v.size()) break;
      v.resize(v.size() * 4);
    }
    v.resize(n);
    return v;
  }

  void *malloc_on(size_t size, c10::DeviceIndex device, cudaStream_t stream) {
    gml_client *c = client(device);
    std::optional<c10::cuda::CUDAStreamCaptureModeGuard> relaxed; // see captures_
    if (captures_.load()) relaxed.emplace(cudaStreamCaptureModeRelaxed);
    void *p = nullptr;
    int rc = gml_alloc_ex(c, size, reinterpret_cast<gml_stream>(stream), context_for_alloc(), &p);
    if (rc == 0) return p;
    std::string msg = gml_last_error(c);
    if (rc == GML_ENOMEM || rc == GML_EQUOTA) {
      gml_mem_stats m;
      gml_mem_stats_get(c, &m);
      uint64_t free_b = 0, total_b = 0;
      gml_device_memory(c, &free_b, &total_b);
      c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(size), m.allocated_bytes.current, m.reserved_bytes.current,
                                       c10::Device(c10::DeviceType::CUDA, device));
      std::vector<OutOfMemoryObserver> obs;
      {
        std::lock_guard<std::mutex> g(mu_);
        obs = observers_;
      }
      for (auto &o : obs) o(device, m.allocated_bytes.current, m.limit_bytes ? m.limit_bytes : total_b, free_b);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. ", msg);
    }
    TORCH_CHECK(false, "gmlake: allocation of ", gml_num((long long)size), " bytes failed: ", gml_strerror(rc), ": ",
                msg);
    return nullptr;
  }

  void free_ptr(void *ptr) {
    if (!ptr) return;
    gml_client *c = client_of(ptr);
    TORCH_CHECK(c, "gmlake: free of ", gml_ptr(ptr), ", which no lake client holds");
    std::optional<c10::cuda::CUDAStreamCaptureModeGuard> relaxed; // see captures_
    if (captures_.load()) relaxed.emplace(cudaStreamCaptureModeRelaxed);
    int rc = gml_free_ex(c, ptr, context_for_free());
    TORCH_CHECK(rc == 0, "gmlake: free of ", gml_ptr(ptr), ": ", gml_last_error(c));
  }

  void apply_fraction(gml_client *c, c10::DeviceIndex device, double fraction) {
    uint64_t free_b = 0, total_b = 0;
    gml_device_memory(c, &free_b, &total_b);
    gml_set_limit(c, fraction >= 1.0 ? 0 : static_cast<size_t>(fraction * static_cast<double>(total_b)));
  }

  // ---------- c10::Allocator ----------
  c10::DataPtr allocate(size_t size) override {
    c10::DeviceIndex device = c10::cuda::current_device();
    if (size == 0) return {nullptr, nullptr, &local_raw_delete, c10::Device(c10::DeviceType::CUDA, device)};
    void *p = malloc_on(size, device, c10::cuda::getCurrentCUDAStream(device).stream());
    return {p, p, &local_raw_delete, c10::Device(c10::DeviceType::CUDA, device)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &local_raw_delete; }
  void copy_data(void *dest, const void *src, std::size_t count) const override {
    C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
  }

  // ---------- DeviceAllocator ----------
  bool initialized() override { return initialized_; }
  void emptyCache(c10::MempoolId_t mempool_id) override {
    (void)mempool_id; // a pool's free blocks go back once it is released (gml_pool_release)
    for (int d = 0; d < kMaxDevices; d++)
      if (gml_client *c = gml_device_client_if_open(d)) gml_trim(c, nullptr);
  }
  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    gml_mem_stats m;
    DeviceStats s;
    if (gml_client *c = gml_device_client_if_open(device)) gml_mem_stats_get(c, &m);
    else memset(&m, 0, sizeof m);
    auto put = [](c10::CachingAllocator::StatArray &a, const gml_stat &g) {
      c10::CachingAllocator::Stat &x = a[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
      x.current = g.current, x.peak = g.peak, x.allocated = g.allocated, x.freed = g.freed;
    };
    put(s.allocation, m.allocation);
    put(s.segment, m.segment);
    put(s.active, m.active);
    put(s.inactive_split, m.inactive_split);
    put(s.allocated_bytes, m.allocated_bytes);
    put(s.reserved_bytes, m.reserved_bytes);
    put(s.active_bytes, m.active_bytes);
    put(s.inactive_split_bytes, m.inactive_split_bytes);
    put(s.requested_bytes, m.requested_bytes);
    s.num_alloc_retries = m.num_alloc_retries;
    s.num_ooms = m.num_ooms;
    s.num_sync_all_streams = m.num_sync_all_streams;
    s.num_device_alloc = m.num_device_alloc;
    s.num_device_free = m.num_device_free;
    s.max_split_size = std::numeric_limits<int64_t>::max();
    return s;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    if (gml_client *c = gml_device_client_if_open(device)) gml_reset_accumulated(c);
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    if (gml_client *c = gml_device_client_if_open(device)) gml_reset_peak(c);
  }

  // ---------- CUDAAllocator ----------
  void *raw_alloc(size_t nbytes) override {
    if (!nbytes) return nullptr;
    c10::DeviceIndex device = c10::cuda::current_device();
    return malloc_on(nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
  }
  void *raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    if (!nbytes) return nullptr;
    return malloc_on(nbytes, c10::cuda::current_device(), stream);
  }
  void raw_delete(void *ptr) override { free_ptr(ptr); }
  void init(int device_count) override {
    device_count_ = device_count;
    initialized_ = true;
  }
  double getMemoryFraction(c10::DeviceIndex device) override { return fraction_[device] > 0 ? fraction_[device] : 1.0; }
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    TORCH_CHECK(fraction >= 0 && fraction <= 1, "invalid fraction ", gml_num(fraction), ", please set within [0, 1]");
    fraction_[device] = fraction;
    apply_fraction(client(device), device, fraction);
  }
  std::vector<StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex) override { return {}; }
  void enable(bool value) override { enabled_ = value; }
  bool isEnabled() const override { return enabled_; }
  void cacheInfo(c10::DeviceIndex device, size_t *largestBlock) override {
    gml_stats st;
    *largestBlock = 0;
    if (gml_client *c = gml_device_client_if_open(device))
      if (gml_stats_get(c, &st) == 0) *largestBlock = st.largest_free;
  }
  void *getBaseAllocation(void *ptr, size_t *size) override {
    gml_client *c = client_of(ptr);
    TORCH_CHECK(c && gml_size_of(c, ptr, nullptr, size) == 0, "gmlake: ", gml_ptr(ptr),
                " is not the start of a live allocation");
    return ptr;
  }
  void recordStream(const c10::DataPtr &ptr, c10::cuda::CUDAStream stream) override {
    if (!ptr.get() || ptr.get_deleter() != &local_raw_delete) return; // not ours
    gml_client *c = client_of(ptr.get());
    if (c) gml_record_stream(c, ptr.get(), reinterpret_cast<gml_stream>(stream.stream()));
  }

  SnapshotInfo snapshot(c10::MempoolId_t mempool_id, bool include_traces) override {
    SnapshotInfo out;
    bool all = mempool_id.first == 0 && mempool_id.second == 0;
    // unix time in microseconds of a monotonic nanosecond stamp of the C library
    int64_t mono_now =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count();
    int64_t unix_now =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    out.device_traces.resize(std::max(device_count_, 1));
    for (int d = 0; d < kMaxDevices; d++) {
      gml_client *c = gml_device_client_if_open(d);
      if (!c) continue;
      // segments: where the held chunks are shown (gml_segments, gmlake.h),
      // their blocks covering them: allocations, pending frees, free space
      Segments sg = segments(c);
      size_t k = 0;
      for (auto &g : sg.segs) {
        const gml_alloc_info *first = sg.blocks.data() + k;
        k += g.nblocks;
        bool mine = all;
        c10::MempoolId_t pool{0, 0};
        for (size_t i = 0; i < g.nblocks; i++) {
          if (!first[i].pool.a && !first[i].pool.b) continue;
          pool = {first[i].pool.a, first[i].pool.b};
          if (first[i].pool.a == mempool_id.first && first[i].pool.b == mempool_id.second) mine = true;
        }
        if (!mine) continue;
        out.segments.emplace_back();
        SegmentInfo &seg = out.segments.back();
        seg.device = static_cast<c10::DeviceIndex>(d);
        seg.address = g.addr;
        seg.total_size = g.size;
        seg.stream = nullptr; // shared by every stream
        seg.is_large = g.large != 0;
        seg.owner_private_pool_id = pool;
        for (size_t i = 0; i < g.nblocks; i++) {
          const gml_alloc_info &b = first[i];
          BlockInfo bi;
          bi.size = b.size;
          bi.requested_size = b.requested;
          bi.allocated = b.state == GML_BLOCK_ALLOCATED;
          bi.active = b.state == GML_BLOCK_ALLOCATED || b.state == GML_BLOCK_PENDING_FREE;
          bi.context_when_allocated = context(b.tag);
          if (bi.allocated) seg.allocated_size += b.size, seg.requested_size += b.requested;
          if (bi.active) seg.active_size += b.size;
          seg.blocks.push_back(std::move(bi));
        }
      }
      if (!include_traces || d >= static_cast<int>(out.device_traces.size())) continue;
      for (auto &t : trace(c)) {
        if (t.seq > sg.seq) break; // after the segments were read
        static const TraceEntry::Action kAction[] = {TraceEntry::ALLOC,          TraceEntry::FREE_REQUESTED,
                                                     TraceEntry::FREE_COMPLETED, TraceEntry::SEGMENT_MAP,
                                                     TraceEntry::SEGMENT_UNMAP,  TraceEntry::OOM};
        if (t.action < 0 || t.action > GML_TRACE_OOM) continue;
        TraceEntry te(kAction[t.action], static_cast<c10::DeviceIndex>(d), t.addr, t.size,
                      reinterpret_cast<void *>(t.stream), {t.pool.a, t.pool.b}, 0, context(t.tag));
        te.time_.t_ = static_cast<time_t>((unix_now - (mono_now - static_cast<int64_t>(t.time_ns))) / 1000);
        out.device_traces[d].push_back(std::move(te));
      }
    }
    out.config_metadata.garbage_collection_threshold = 0;
    out.config_metadata.max_split_size = std::numeric_limits<size_t>::max();
    out.config_metadata.pinned_num_register_threads = 0;
    out.config_metadata.expandable_segments = false;
    out.config_metadata.release_lock_on_malloc = false;
    out.config_metadata.pinned_use_host_register = false;
    out.config_metadata.graph_capture_record_stream_reuse = false;
    out.config_metadata.last_allocator_settings = "gmlake";
    return out;
  }

  // ---------- private pools (CUDA graphs) ----------
  static int filter_trampoline(void *ctx, gml_stream s) {
    return (*static_cast<std::function<bool(cudaStream_t)> *>(ctx))(reinterpret_cast<cudaStream_t>(s)) ? 1 : 0;
  }
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override {
    gml_client *c = client(device);
    auto f = std::make_unique<std::function<bool(cudaStream_t)>>(std::move(filter));
    int rc = gml_pool_begin(c, to_pool(mempool_id), filter_trampoline, f.get());
    TORCH_CHECK(rc == 0, "gmlake: beginAllocateToPool: ",
                rc == GML_EINVAL ? "already allocating to that pool" : gml_strerror(rc));
    std::lock_guard<std::mutex> g(mu_);
    filters_[{device, mempool_id}] = std::move(f);
    captures_++;
  }
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
    int rc = gml_pool_end(client(device), to_pool(mempool_id));
    TORCH_CHECK(rc == 0, "gmlake: endAllocateToPool: not allocating to that pool");
    std::lock_guard<std::mutex> g(mu_);
    filters_.erase(std::make_pair(device, mempool_id));
    captures_--;
  }
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
    gml_pool_release(client(device), to_pool(mempool_id));
  }
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override {
    int n = gml_pool_use_count(client(device), to_pool(mempool_id));
    return n < 0 ? 0 : n;
  }
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                          std::shared_ptr<CUDAAllocator> allocator) override {
    TORCH_CHECK(!allocator || allocator.get() == this,
                "gmlake: a MemPool with an allocator of its own cannot live inside the lake's allocator");
    TORCH_CHECK(gml_pool_create(client(device), to_pool(mempool_id)) == 0, "gmlake: too many private pools");
  }
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                const std::unordered_set<void *> &expected) override {
    size_t n = 0;
    gml_client *c = client(device);
    gml_pool_live(c, to_pool(mempool_id), nullptr, 0, &n);
    std::vector<void *> live(n + 64);
    if (gml_pool_live(c, to_pool(mempool_id), live.data(), live.size(), &n) != 0) return expected.empty();
    if (n > live.size() || n != expected.size()) return false;
    for (size_t i = 0; i < n; i++)
      if (!expected.count(live[i])) return false;
    return true;
  }
  std::shared_ptr<AllocatorState> getCheckpointState(c10::DeviceIndex device, c10::MempoolId_t id) override {
    gml_client *c = client(device);
    auto s = std::make_shared<Checkpoint>();
    s->pool = id;
    int rc = gml_pool_checkpoint(c, to_pool(id), &s->ckpt);
    TORCH_CHECK(rc == 0, "gmlake: getCheckpointState: ", gml_last_error(c));
    return s;
  }
  // The C library frees what is live now but not in the checkpoint and makes
  // live again what is in it but not now. PyTorch's own allocator frees every
  // allocation of the pool and allocates every one of the checkpoint again,
  // and its callers (torch._C._cuda_setCheckpointPoolState) rely on that
  // delta: a pointer in both lists is not one freed for good, and every
  // allocation of the checkpoint comes with a DataPtr that live storages take
  // as their deleter. So the delta says the same: what stayed live is in both.
  CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device, std::shared_ptr<AllocatorState> as) override {
    auto s = std::dynamic_pointer_cast<Checkpoint>(as);
    TORCH_CHECK(s && s->ckpt, "gmlake: setCheckpointPoolState: not a checkpoint of the lake's allocator");
    gml_client *c = client(device);
    size_t nk = 0, nf = 0, na = 0;
    gml_pool_checkpoint_blocks(s->ckpt, nullptr, 0, &nk);
    std::vector<gml_alloc_info> blocks(nk);
    gml_pool_checkpoint_blocks(s->ckpt, blocks.data(), blocks.size(), &nk);
    gml_pool_live(c, to_pool(s->pool), nullptr, 0, &nf);
    std::vector<void *> freed(nf + 64), allocd(nk);
    int rc;
    while ((rc = gml_pool_restore(c, s->ckpt, freed.data(), freed.size(), &nf, allocd.data(), allocd.size(), &na)) ==
               GML_EINVAL &&
           nf > freed.size())
      freed.resize(nf + 64); // the pool grew since it was counted
    TORCH_CHECK(rc == 0, "gmlake: setCheckpointPoolState: ", gml_strerror(rc), ": ", gml_last_error(c));
    std::unordered_set<void *> made_live(allocd.begin(), allocd.begin() + static_cast<std::ptrdiff_t>(na));
    CheckpointDelta delta;
    delta.ptrs_freed.assign(freed.begin(), freed.begin() + static_cast<std::ptrdiff_t>(nf));
    c10::Device dev(c10::DeviceType::CUDA, device);
    for (const gml_alloc_info &b : blocks) {
      void *p = reinterpret_cast<void *>(b.addr);
      if (!made_live.count(p)) delta.ptrs_freed.push_back(p); // live then and now
      delta.dataptrs_allocd.emplace_back(p, p, &local_raw_delete, dev);
    }
    return delta;
  }

  // ---------- IPC (torch.multiprocessing) ----------
#ifndef GMLAKE_NO_IPC
  // A lake tensor goes out in PyTorch's expandable-segment format (_torch_ipc.h), so a process on
  // PyTorch's own allocator opens it too; the offset is the allocation's in its first chunk.
  ShareableHandle shareIpcHandle(void *ptr) override {
    gml_client *c = client_of(ptr);
    TORCH_CHECK(c, "gmlake: cannot share ", gml_ptr(ptr), " with another process: no lake client holds it");
    size_t off = 0;
    std::string s = gmlake_ipc::lake_handle(c, ptr, &off);
    return ShareableHandle{static_cast<ptrdiff_t>(off), s};
  }
  // Any sender's handle: a lake's (through its socket, else its chunks' fds), PyTorch's expandable
  // segments' (the fds, pidfd_getfd), PyTorch's default allocator's (cudaIpcOpenMemHandle), or an
  // older GMLake's 64-byte handle.
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
    std::lock_guard<std::mutex> g(ipc_mu_);
    auto it = ipc_open_.find(handle);
    if (it != ipc_open_.end())
      if (auto sp = it->second.lock()) return sp;
    std::shared_ptr<void> sp;
    gml_ipc_handle h;
    if (handle.size() == GML_IPC_HANDLE_SIZE) {
      memcpy(h.bytes, handle.data(), GML_IPC_HANDLE_SIZE);
      TORCH_CHECK(gml_ipc_device(&h) >= 0, "gmlake: an IPC handle this process cannot read (",
                  gml_num((long long)handle.size()), " bytes, neither PyTorch's format nor the lake's)");
      sp = open_lake(h, 0, nullptr);
    } else if (handle.size() >= 2 && handle[1] == gmlake_ipc::kCudaMalloc) {
      sp = gmlake_ipc::open_cuda_malloc(handle);
    } else if (handle.size() >= 2 && handle[1] == gmlake_ipc::kExpandable) {
      gmlake_ipc::Expandable e = gmlake_ipc::parse_expandable(handle);
      std::string why;
      if (e.lake) sp = open_lake(e.h, e.offset, &why);
      if (!sp) { // PyTorch's own expandable segments, or a lake whose socket is out of reach
        try {
          sp = gmlake_ipc::open_fds(e.hd.pid, e.hd.segment_size, e.fds, c10::cuda::current_device());
        } catch (const c10::Error &err) {
          std::string msg = err.what_without_backtrace();
          if (!why.empty()) msg += " (the lake's own way failed first: " + why + ")";
          TORCH_CHECK(false, msg);
        }
      }
    } else {
      TORCH_CHECK(false, "gmlake: an IPC handle this process cannot read (", gml_num((long long)handle.size()),
                  " bytes, type byte ", gml_num((long long)(handle.size() > 1 ? handle[1] : -1)),
                  "): from a newer PyTorch or another allocator? Both processes need the same PyTorch version");
    }
    ipc_open_[handle] = sp;
    return sp;
  }
  // The lake's own way in (gml_ipc_open, through the exporter's socket): the pointer off bytes before
  // the allocation (where the sender's storage offset counts from). With why, a failure other than a
  // refusal returns null and says why there (the caller tries the fds); a refusal (another user
  // answering for the exporter) is never retried another way.
  std::shared_ptr<void> open_lake(const gml_ipc_handle &h, uint64_t off, std::string *why) {
    int dev = gml_ipc_device(&h);
    TORCH_CHECK(dev >= 0, "gmlake: a lake IPC handle of an unknown version");
    gml_client *c = client(static_cast<c10::DeviceIndex>(dev));
    void *p = nullptr;
    size_t size = 0;
    int rc = gml_ipc_open(c, &h, &p, &size);
    if (rc != 0 && why && rc != GML_EPERM) {
      *why = gml_last_error(c);
      return nullptr;
    }
    TORCH_CHECK(rc == 0, "gmlake: cannot open memory shared by another process: ", gml_last_error(c));
    return std::shared_ptr<void>(static_cast<char *>(p) - off, [c, p](void *) { gml_ipc_close(c, p); });
  }
#else // a fallback build (bench/gpu.sh) when the IPC code does not compile
  ShareableHandle shareIpcHandle(void *) override { TORCH_CHECK(false, "gmlake: built without IPC"); }
  std::shared_ptr<void> getIpcDevPtr(std::string) override { TORCH_CHECK(false, "gmlake: built without IPC"); }
#endif

  // ---------- history, observers ----------
  bool isHistoryEnabled() override { return history_cap_ != 0; }
  void recordHistory(bool enabled, CreateContextFn context_recorder, size_t alloc_trace_max_entries, RecordContext when,
                     bool clearHistory, const std::vector<std::string> &) override {
    history_cap_ = enabled ? std::max<size_t>(alloc_trace_max_entries, 1) : 0;
    recorder_ = enabled ? context_recorder : nullptr;
    when_ = enabled ? when : RecordContext::NEVER;
    for (int d = 0; d < kMaxDevices; d++) {
      gml_client *c = gml_device_client_if_open(d);
      if (!c) continue;
      if (enabled && !clearHistory) {
        // keep what was recorded if the ring's size stays (enable resets it otherwise)
        if (history_sizes_[d] != history_cap_) gml_trace_enable(c, history_cap_);
      } else {
        gml_trace_enable(c, history_cap_);
      }
      history_sizes_[d] = history_cap_;
    }
    if (!enabled) {
      std::lock_guard<std::mutex> g(ctx_mu_);
      contexts_.clear();
    } else {
      prune_contexts();
    }
  }
  void attachOutOfMemoryObserver(OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> g(mu_);
    observers_.push_back(std::move(observer));
  }
  void attachAllocatorTraceTracker(AllocatorTraceTracker) override {
    TORCH_CHECK(false, "gmlake does not call allocator trace trackers yet (attachAllocatorTraceTracker)");
  }

  // ---------- devices ----------
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    // lake memory is cuMemMap'd: copies between devices go through
    // cudaMemcpyPeerAsync (memcpyAsync below), which needs no mapping of the peer
    (void)dev, (void)dev_to_access;
  }
  cudaError_t memcpyAsync(void *dst, int dstDevice, const void *src, int srcDevice, size_t count, cudaStream_t stream,
                          bool p2p_enabled) override {
    if (dstDevice == srcDevice) return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    (void)p2p_enabled;
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
  }
  std::string name() override { return "gmlake"; }

private:
  bool initialized_ = false, enabled_ = true;
  int device_count_ = 0;
  std::once_flag opened_[kMaxDevices];
  double fraction_[kMaxDevices] = {};
  size_t history_cap_ = 0;
  size_t history_sizes_[kMaxDevices] = {};
  CreateContextFn recorder_ = nullptr;
  RecordContext when_ = RecordContext::NEVER;
  std::mutex mu_, ctx_mu_;
  std::vector<OutOfMemoryObserver> observers_;
  std::map<std::pair<c10::DeviceIndex, c10::MempoolId_t>, std::unique_ptr<std::function<bool(cudaStream_t)>>> filters_;
  std::unordered_map<uint64_t, std::shared_ptr<c10::GatheredContext>> contexts_;
  uint64_t next_tag_ = 0;
  // Graphs being captured. In global capture mode, driver calls that might
  // synchronize are refused on this thread: the lake maps chunks in relaxed
  // mode then, as PyTorch's own allocator does around cudaMalloc.
  std::atomic<int> captures_{0};
  std::mutex ipc_mu_;
  std::unordered_map<std::string, std::weak_ptr<void>> ipc_open_;
};

// Never destroyed: tensors may be freed by static destructors after ours ran.
GmlakeAllocator *the_allocator = nullptr;

void local_raw_delete(void *ptr) { the_allocator->free_ptr(ptr); }

// "" on success, else why not. Errors come back as values: a C++ exception
// thrown through this module's bindings crashed the process on the H100
// (torch 2.11) instead of becoming a RuntimeError.
std::string install() {
  if (the_allocator && get() == the_allocator) return "";
  auto *keep = new std::shared_ptr<GmlakeAllocator>(std::make_shared<GmlakeAllocator>());
  // torch.cuda.memory.change_current_allocator's own path: refuses once
  // PyTorch's allocator is initialized, then swaps the global atomic
  try {
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(*keep);
  } catch (const std::exception &e) {
    delete keep;
    return e.what();
  }
  the_allocator = keep->get();
  // ... and what c10::GetAllocator(kCUDA) / getDeviceAllocator(kCUDA) return
  // (the device-generic torch.accelerator.* memory calls), which still named
  // PyTorch's own allocator, never initialized once we replaced it
  c10::SetAllocator(c10::DeviceType::CUDA, the_allocator, /*priority=*/255);
  return "";
}

// None while the device has no client yet (nothing allocated there): no
// exception crosses into Python here (Trainer asks memory_allocated() first thing)
py::object stats(int device) {
  gml_client *c = gml_device_client_if_open(device);
  if (!c) return py::none();
  gml_stats s;
  gml_stats_get(c, &s);
  py::dict d;
#define F(x) d[#x] = s.x
  F(allocated);
  F(reserved);
  F(cached);
  F(stitched);
  F(largest_free);
  F(peak_allocated);
  F(peak_reserved);
  F(alloc_count);
  F(free_count);
  F(chunks_leased);
  F(chunks_returned);
  F(maps);
  F(unmaps);
  F(ooms);
  F(syncs);
  F(lease_calls);
  F(lease_p50_ns);
  F(lease_p99_ns);
  F(fragmentation);
  F(chunk_size);
  F(access_calls);
  F(mapped_allocs);
  F(headroom_leased);
  F(map_ns);
  F(malloc_ns);
  F(version);
  F(growable_ranges);
  F(growable_mapped);
  F(growable_unmapped);
  F(paused_bytes);
  F(paused_saved);
  F(borrows);
  F(borrow_waits);
  F(shared_mapped);
  F(lease_wait_ns);
  F(import_ns);
  F(map_call_ns);
  F(access_ns);
  F(chunks_streamed);
  F(swap_out_bytes);
  F(swap_in_bytes);
  F(swap_copy_ns);
  F(swap_host_bytes);
  F(plan_steps);
  F(plan_hits);
  F(plan_misses);
  F(plans_taken);
  F(plan_range);
#undef F
  d["backend"] = s.backend ? std::string(s.backend) : std::string("?");
  d["mode"] = s.mode == GML_MODE_DAEMON ? "daemon" : s.mode == GML_MODE_EMBEDDED ? "embedded" : "?";
  gml_mem_stats m;
  gml_mem_stats_get(c, &m);
  d["limit_bytes"] = m.limit_bytes;
  return d;
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "GMLake's PyTorch CUDA allocator (use gmlake.enable())";
  m.def("install", &install, "make the lake PyTorch's CUDA allocator (before any CUDA allocation)");
  m.def("installed", [] { return the_allocator && get() == the_allocator; });
  m.def("stats", &stats, py::arg("device"));
  m.def("trim", [](int device) -> py::object { // the bytes given back; None: no client (gmlake.trim raises)
    gml_client *c = gml_device_client_if_open(device);
    if (!c) return py::none();
    size_t n = 0;
    gml_trim(c, &n);
    return py::int_(n);
  });
}
